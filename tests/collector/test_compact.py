"""Partitioned parts merge across flushes, and every span stays stored exactly once."""

from __future__ import annotations

import http.client
import json
import signal
import time
import urllib.parse
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pytest

from chiptrace.collector.compact import COMPACT_MIN_PARTS
from chiptrace.collector.sink import PartitionedStoreSink
from chiptrace.collector.wal import PartTag
from chiptrace.store import MANIFEST_DIR, PartWriter
from tests.collector.test_collect import Collector, post, start_collect, stored_count_said
from tests.collector.test_wal import hosted, many_hosts_request, span_ids
from tests.waiting import wait_until


def files_per_folder(out: Path) -> Counter[str]:
    return Counter(p.parent.name for p in (out / "spans").rglob("*.parquet"))


def test_parts_of_many_flushes_merge_and_every_span_stays_once(tmp_path: Path) -> None:
    out = tmp_path / "hosts"
    c = Collector(out, partition_by=("host",), flush_interval_s=0.05)
    try:
        for r in range(10):  # 10 flushes of 20 hosts x 2 spans: 10 parts a host unmerged
            assert post(c.url, many_hosts_request(r, 20, 2))[0] == 200
            wait_until(lambda r=r: c.service.spool.stored == 40 * (r + 1), f"flush {r}")
        wait_until(
            lambda: max(files_per_folder(out).values()) < COMPACT_MIN_PARTS, "the last merge"
        )
    finally:
        c.close()
    per_host = files_per_folder(out)
    assert len(per_host) == 20 and max(per_host.values()) < COMPACT_MIN_PARTS, per_host
    ids = span_ids(out)
    assert sorted(ids) == list(range(1, 401))  # each once


def test_a_merge_killed_before_its_members_went_is_undone_by_the_next_collector(
    tmp_path: Path,
) -> None:
    out = tmp_path / "t"
    dead = "deadhost-1-abcdef"
    sink = PartitionedStoreSink(PartWriter(out, {"partition_by": ["host"]}, dead), ("host",))
    a, b = hosted(1, 30), hosted(31, 30)
    sink.write(pa.Table.from_batches([a]), PartTag(dead, 1, 1))
    sink.write(pa.Table.from_batches([b]), PartTag(dead, 2, 2))
    sink.write(pa.Table.from_batches([a, b]), PartTag(dead, 1, 2))  # the merge, members left
    assert sum(files_per_folder(out).values()) == 9  # 3 hosts x 3 parts
    Collector(out, partition_by=("host",)).close()
    assert sorted(span_ids(out)) == list(range(1, 61))
    names = {p.name for p in (out / "spans").rglob("*.parquet")}
    assert names == {PartTag(dead, 1, 2).name}


def spans_written(out: Path) -> int:
    return sum(
        json.loads(p.read_text()).get("spans_written", 0)
        for p in (out / MANIFEST_DIR).glob("*.json")
    )


@pytest.mark.timing  # bounds SIGTERM's wall time: run alone (CI's timing step)
def test_a_thousand_hosts_flushed_ten_times_make_few_files_each_and_stop_fast(
    tmp_path: Path,
) -> None:
    out = tmp_path / "hosts"
    proc, url = start_collect(out, "--partition-by", "host", "--flush-interval", "0.2")
    u = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=60)
    for r in range(10):  # 10 flushes of 1,000 hosts x 2 spans
        body = many_hosts_request(r, 1000, 2)
        conn.request("POST", u.path, body, {"Content-Type": "application/x-protobuf"})
        resp = conn.getresponse()
        resp.read()
        assert resp.status == 200
        wait_until(lambda r=r: spans_written(out) >= 2000 * (r + 1), f"flush {r}", 120)
    conn.close()
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    stop_s = time.monotonic() - t0
    assert proc.returncode == 0, err[-2000:]
    assert stored_count_said(err) == 20_000
    per_host = files_per_folder(out)
    assert len(per_host) == 1000 and max(per_host.values()) <= 4, max(per_host.values())
    assert stop_s < 5, f"SIGTERM took {stop_s:.1f} s"
    print(f"SIGTERM {stop_s:.2f} s, files per host {Counter(per_host.values())}")


def test_a_merge_never_spans_a_large_part(tmp_path: Path) -> None:
    """A merge named 1-7 over a large part 3-3 would make drop_merged delete that part."""
    out = tmp_path / "t"
    writer = PartWriter(out, {"partition_by": ["host"]}, "w-1-abcdef")
    sink = PartitionedStoreSink(writer, ("host",))
    compactor = sink.compactor
    assert compactor is not None
    compactor.max_rows = 50  # parts of 90 rows (30 a host) or more are large here
    for seq in range(1, 8):
        rows = 180 if seq == 3 else 3
        sink.write(
            pa.Table.from_batches([hosted(seq * 1000, rows)]), PartTag("w-1-abcdef", seq, seq)
        )
    assert compactor.run(released_through=7) == 3 * 4  # 4-7 merged in each of 3 hosts
    names = sorted(p.name for p in (out / "spans" / "host=node1").glob("*.parquet"))
    assert names == sorted(
        PartTag("w-1-abcdef", f, la).name for f, la in ((1, 1), (2, 2), (3, 3), (4, 7))
    )
    Collector(out, partition_by=("host",)).close()  # drop_merged keeps every one of them
    expected = [s * 1000 + i for s in range(1, 8) for i in range(180 if s == 3 else 3)]
    assert sorted(span_ids(out)) == expected
