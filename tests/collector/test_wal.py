"""An acknowledgement survives SIGKILL: the write-ahead log and its replay, exactly once."""

from __future__ import annotations

import http.client
import os
import signal
import threading
import time
import urllib.parse
from pathlib import Path

import pyarrow as pa
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

import chiptrace
from chiptrace.collector.sink import PartitionedStoreSink
from chiptrace.collector.wal import WAL_DIR, PartTag, WriteAheadLog, encode
from chiptrace.collector.wal_replay import replay
from chiptrace.errors import StoreError
from chiptrace.store import PartWriter
from tests.collector.test_collect import start_collect, stored_count_said
from tests.collector.test_spool import spans
from tests.waiting import wait_until

HOSTS = ("node1", "node2", "node3")


def span_ids(out: Path) -> list[int]:
    con = chiptrace.connect(out)
    return [int(r[0], 16) for r in con.sql("SELECT span_id FROM spans").fetchall()]


def hosted(first: int, n: int) -> pa.RecordBatch:
    """Spans first..first+n-1, spread over HOSTS (so a part splits into partitions)."""
    return spans(first, n, host=[HOSTS[i % len(HOSTS)] for i in range(n)])


def killed(wal: WriteAheadLog) -> None:
    """What SIGKILL does to a log: its files closed as they are, the lock released."""
    for fd in (wal._fd, wal._lock_fd):
        if fd is not None:
            os.close(fd)


def test_replay_writes_what_no_part_holds_and_finishes_a_half_written_part(
    tmp_path: Path,
) -> None:
    out = tmp_path / "t"
    dead = "deadhost-1-abcdef"
    wal = WriteAheadLog(out, dead)
    for r in range(6):  # records 1..6, 30 spans each
        wal.sync(wal.append(encode(hosted(r * 30 + 1, 30))))
    # The killed run had written records 1-2 whole and 3-4 in node1's folder only.
    sink = PartitionedStoreSink(PartWriter(out, {"partition_by": ["host"]}, dead), ("host",))
    sink.write(pa.Table.from_batches([hosted(1, 30), hosted(31, 30)]), PartTag(dead, 1, 2))
    part = pa.Table.from_batches([hosted(61, 30), hosted(91, 30)])
    sink.write(part.filter(pa.compute.equal(part["host"], "node1")), PartTag(dead, 3, 4))
    killed(wal)
    live = WriteAheadLog(out, "livehost-2-abcdef")  # the next collector takes the lock
    assert replay(out, PartWriter(out)) == 20 + 20 + 60  # split by host, as its manifest says
    assert sorted(span_ids(out)) == list(range(1, 181))
    assert not list((out / WAL_DIR).glob("*.wal"))
    assert replay(out, PartWriter(out), ("host",)) == 0  # once only
    live.close(0, lambda: None)


def test_a_second_collector_on_the_same_directory_is_refused(tmp_path: Path) -> None:
    wal = WriteAheadLog(tmp_path, "a-1-abcdef")
    with pytest.raises(StoreError, match="another chiptrace collect"):
        WriteAheadLog(tmp_path, "b-2-abcdef")
    wal.close(0, lambda: None)
    WriteAheadLog(tmp_path, "b-2-abcdef").close(0, lambda: None)


def test_a_torn_tail_is_ignored(tmp_path: Path) -> None:
    wal = WriteAheadLog(tmp_path, "a-1-abcdef")
    wal.sync(wal.append(encode(spans(1, 5))))
    seg = next((tmp_path / WAL_DIR).glob("*.wal"))
    with open(seg, "ab") as f:
        f.write(b"CTW1\x00\x00")  # a record cut short by a power loss
    killed(wal)
    live = WriteAheadLog(tmp_path, "b-2-abcdef")
    assert replay(tmp_path, PartWriter(tmp_path)) == 5
    live.close(0, lambda: None)


# ---------------------------------------------------------------- SIGKILL under load

SPANS_PER_REQUEST = 100


def request(first: int) -> bytes:
    req = ExportTraceServiceRequest()
    rs = req.resource_spans.add()
    kv = rs.resource.attributes.add()
    kv.key, kv.value.string_value = "host.name", HOSTS[first % len(HOSTS)]
    ss = rs.scope_spans.add()
    trace = os.urandom(16)
    for sid in range(first, first + SPANS_PER_REQUEST):
        s = ss.spans.add()
        s.trace_id, s.span_id, s.name = trace, sid.to_bytes(8, "big"), "op"
        s.start_time_unix_nano, s.end_time_unix_nano = 1_700_000_000_000_000_000 + sid, 2 << 60
    return req.SerializeToString()


def send_until_killed(url: str, next_id: list[int], acked: list[int], lock: threading.Lock) -> None:
    """Post fresh spans until the server is gone; record the acknowledged ids."""
    u = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=30)
    for _ in range(10_000):  # bounded; the kill ends it long before
        with lock:
            first = next_id[0]
            next_id[0] += SPANS_PER_REQUEST
        try:
            conn.request("POST", u.path, request(first), {"Content-Type": "application/x-protobuf"})
            resp = conn.getresponse()
            resp.read()
        except (OSError, http.client.HTTPException):
            return
        if resp.status == 200:
            with lock:
                acked.extend(range(first, first + SPANS_PER_REQUEST))


def kill_under_load(out: Path, kills: int) -> None:
    acked: list[int] = []
    next_id, lock = [1], threading.Lock()
    for k in range(kills):
        proc, url = start_collect(out, "--partition-by", "host", "--flush-interval", "0.1")
        before = len(acked)
        senders = [
            threading.Thread(target=send_until_killed, args=(url, next_id, acked, lock))
            for _ in range(4)
        ]
        for t in senders:
            t.start()
        # Kill at a different point each time: after 1 to 40 acknowledged requests.
        goal = before + SPANS_PER_REQUEST * (1 + (k * 7) % 40)
        wait_until(lambda g=goal: len(acked) >= g, "acknowledgements", timeout_s=60)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        for t in senders:
            t.join(timeout=60)
        proc.stdout.close()
        proc.stderr.close()
    proc, _ = start_collect(out)  # the next collect on the directory stores what is left
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-2000:]
    ids = span_ids(out)
    assert len(ids) == len(set(ids)), f"{len(ids) - len(set(ids))} spans stored twice"
    lost = set(acked) - set(ids)
    assert not lost, f"{len(lost)} of {len(acked)} acknowledged spans lost"
    assert stored_count_said(err) >= 0


def test_sigkill_under_load_loses_no_acknowledged_span(tmp_path: Path) -> None:
    kill_under_load(tmp_path / "killed", kills=2)


@pytest.mark.load
@pytest.mark.skipif(
    not os.environ.get("CHIPTRACE_LOAD_TESTS"), reason="load test: set CHIPTRACE_LOAD_TESTS=1"
)
def test_twenty_sigkills_under_load_lose_nothing_and_store_nothing_twice(tmp_path: Path) -> None:
    t0 = time.monotonic()
    kill_under_load(tmp_path / "killed", kills=20)
    assert time.monotonic() - t0 < 600


# ---------------------------------------------------------------- partitions


def many_hosts_request(round_: int, hosts: int, per_host: int) -> bytes:
    req = ExportTraceServiceRequest()
    for h in range(hosts):
        rs = req.resource_spans.add()
        kv = rs.resource.attributes.add()
        kv.key, kv.value.string_value = "host.name", f"node{h:04d}"
        ss = rs.scope_spans.add()
        for k in range(per_host):
            sid = (round_ * hosts + h) * per_host + k + 1
            s = ss.spans.add()
            s.trace_id, s.span_id, s.name = b"\x03" * 16, sid.to_bytes(8, "big"), "op"
            s.start_time_unix_nano, s.end_time_unix_nano = 1_700_000_000_000_000_000, 2 << 60
    return req.SerializeToString()


@pytest.mark.timing  # bounds SIGTERM's wall time: run alone (CI's timing step)
def test_a_thousand_hosts_make_few_files_each_and_stop_fast(tmp_path: Path) -> None:
    out = tmp_path / "hosts"
    proc, url = start_collect(out, "--partition-by", "host")
    u = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=60)
    for r in range(10):  # 10 rounds of 1,000 hosts x 2 spans: the 20,000 spans
        conn.request(
            "POST",
            u.path,
            many_hosts_request(r, 1000, 2),
            {"Content-Type": "application/x-protobuf"},
        )
        resp = conn.getresponse()
        resp.read()
        assert resp.status == 200
    conn.close()
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    stop_s = time.monotonic() - t0
    assert proc.returncode == 0, err[-2000:]
    assert stored_count_said(err) == 20_000
    files = list((out / "spans").rglob("*.parquet"))
    per_host = len(files) / 1000
    assert per_host <= 3, f"{len(files)} files for 1,000 hosts"
    assert stop_s < 5, f"SIGTERM took {stop_s:.1f} s"
