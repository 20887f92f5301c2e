"""`chiptrace collect`: real OTel SDK exporters in other processes, bad input, SIGTERM."""

from __future__ import annotations

import gzip
import json
import re
import signal
import socket
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pyarrow as pa
import pytest
from google.protobuf.json_format import MessageToDict
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

import chiptrace
from chiptrace._attributes import attributes as span_attributes
from chiptrace.collector.receiver import OtlpReceiver
from chiptrace.collector.service import CollectOptions, CollectSummary
from chiptrace.collector.service import Collector as CollectService
from chiptrace.schema import batch_from_columns, ids_to_binary, trace_ids_to_binary
from tests.waiting import wait_until

SENDER = Path(__file__).with_name("sdk_sender.py")
GRPC_METHOD = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"


class Collector:
    """The collector `chiptrace collect` runs, in-process, on free ports."""

    def __init__(self, out: Path, **opts: Any) -> None:
        options = {
            "http": "127.0.0.1:0",
            "grpc": "127.0.0.1:0",
            "max_request_bytes": 1 << 20,
            "flush_interval_s": 60.0,
            "flush_spans": 1_000_000,
            "max_buffered": 1_000_000,
            "min_free_bytes": 0,
            **opts,
        }
        self.out = out
        self.service = CollectService(CollectOptions(out=out, **options)).start()
        self.receiver = self.service.receiver
        self.url = self.receiver.http_url
        self.grpc_target = self.receiver.grpc_target

    def close(self) -> CollectSummary:
        return self.service.stop()


@pytest.fixture
def collector(tmp_path: Path) -> Iterator[Collector]:
    c = Collector(tmp_path / "collected")
    yield c
    c.close()


def post(
    url: str, body: bytes, ctype: str = "application/x-protobuf", **headers: str
) -> tuple[int, bytes]:
    req = urllib.request.Request(
        url, data=body, method="POST", headers={"Content-Type": ctype, **headers}
    )
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def sample_request(n: int = 3, first_id: int = 1) -> bytes:
    from chiptrace.exporters.otlp_encode import encode_request

    batch = batch_from_columns(
        {
            "trace_id": trace_ids_to_binary([bytes([5]) * 16] * n),
            "span_id": ids_to_binary(range(first_id, first_id + n)),
            "name": "s",
            "start_ns": list(range(n)),
            "end_ns": list(range(1, n + 1)),
            "chip_id": "npu:0",
            "chip_type": "npu",
            "resource": '{"service.name":"t"}',
            "scope": "x",
        }
    )
    return encode_request(batch)


def stored(out: Path) -> dict[str, dict]:
    con = chiptrace.connect(out)
    return {r["span_id"]: r for r in con.sql("SELECT * FROM spans").to_arrow_table().to_pylist()}


def start_collect(
    out: Path, *flags: str, command: str = "collect", ignore_sigint: bool = False
) -> tuple[Any, str]:
    """`chiptrace collect --listen 127.0.0.1:0 --out OUT FLAGS` (or `view --otlp`) in a
    process; returns it and its OTLP/HTTP URL, read from its first line. `ignore_sigint`
    starts it with SIGINT ignored, as a shell's background job is."""
    listen = (
        ["--otlp", "127.0.0.1:0", "--no-ui"] if command == "view" else ["--listen", "127.0.0.1:0"]
    )
    argv = [sys.executable, "-m", "chiptrace", command, *listen, "--out", str(out), *flags]
    if ignore_sigint:
        argv = ["sh", "-c", 'trap "" INT; exec "$@"', "sh", *argv]
    proc = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    line = proc.stdout.readline()
    found = re.search(r"http://\S+/v1/traces", line)
    proc.banner = line  # type: ignore[attr-defined]  # the gRPC address, when asked for one
    if not found:
        proc.kill()
        raise AssertionError(f"no URL in {line!r}: {proc.communicate()[1][-2000:]}")
    return proc, found.group()


def stored_count_said(err: str) -> int:
    """N from the exit line's `stored N spans`."""
    said = re.search(r"stored ([\d,]+) spans", err)
    assert said, err[-2000:]
    return int(said.group(1).replace(",", ""))


def run_sender(*args: str) -> list[dict]:
    proc = subprocess.run(
        [sys.executable, str(SENDER), *args], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.mark.parametrize("transport", ["http", "http-gzip", "grpc", "grpc-gzip"])
def test_real_sdk_exporters_spans_arrive_exactly(collector: Collector, transport: str) -> None:
    args = (
        ["--http", collector.url]
        if transport.startswith("http")
        else ["--grpc", collector.grpc_target]
    )
    sent = run_sender(*args, "--spans", "200", *(["--gzip"] if transport.endswith("gzip") else []))
    collector.close()
    rows = stored(collector.out)
    assert len(rows) == len(sent) == 200
    for s in sent:
        r = rows[s["span_id"]]
        assert (r["trace_id"], r["parent_span_id"]) == (s["trace_id"], s["parent"])
        assert (r["start_ns"], r["end_ns"], r["name"]) == (s["start"], s["end"], s["name"])
        assert r["kind"] == s["kind"] + 1  # the Python API counts from INTERNAL=0, OTLP from 1
        assert span_attributes(r) == s["attributes"]
        assert (r["service"], r["host"], r["pid"], r["scope"]) == (
            "sdk-app",
            "node7",
            4242,
            "sdk.lib",
        )
        events = json.loads(r["events"]) if r["events"] else []
        assert [[e["name"], e["time_ns"], e["attributes"]] for e in events] == s["events"]
        links = json.loads(r["links"]) if r["links"] else []
        assert [[lk["span_id"], lk["attributes"]] for lk in links] == s["links"]
    assert {r["chip_id"] for r in rows.values()} == {None, "gpu:0", "gpu:1", "gpu:2", "gpu:3"}


def _to_otlp_json(body: bytes) -> bytes:
    """OTLP/JSON as the specification writes it: camelCase, ids in hex."""
    doc = MessageToDict(ExportTraceServiceRequest.FromString(body))
    import base64

    for rs in doc["resourceSpans"]:
        for ss in rs["scopeSpans"]:
            for sp in ss["spans"]:
                for key in ("traceId", "spanId", "parentSpanId"):
                    if key in sp:
                        sp[key] = base64.b64decode(sp[key]).hex()
    return json.dumps(doc).encode()


def test_http_json_and_gzip(collector: Collector) -> None:
    status, resp = post(collector.url, _to_otlp_json(sample_request(3, 100)), "application/json")
    assert (status, resp) == (200, b"{}")
    status, resp = post(
        collector.url, gzip.compress(sample_request(2, 200)), **{"Content-Encoding": "gzip"}
    )
    assert status == 200 and not ExportTraceServiceResponse.FromString(resp).HasField(
        "partial_success"
    )
    collector.close()
    rows = stored(collector.out)
    assert sorted(int(k, 16) for k in rows) == [100, 101, 102, 200, 201]
    assert {r["chip_id"] for r in rows.values()} == {"npu:0"}


def _raw_http(port: int, head: bytes, body: bytes) -> int:
    """Send head+body, close our side, return the status (for truncated bodies)."""
    with socket.create_connection(("127.0.0.1", port), timeout=60) as s:
        s.sendall(head + body)
        s.shutdown(socket.SHUT_WR)
        return int(s.makefile("rb").readline().split()[1])


def test_bad_requests_get_4xx_and_the_server_keeps_serving(collector: Collector) -> None:
    url = collector.url
    assert post(url, b"\x0a\xff\xff\xff")[0] == 400  # truncated length-delimited field
    assert post(url, b"not json", "application/json")[0] == 400
    assert (
        post(
            url,
            b'{"resourceSpans":[{"scopeSpans":[{"spans":[{"traceId":"zz"}]}]}]}',
            "application/json",
        )[0]
        == 400
    )
    assert post(url, sample_request(), "text/plain")[0] == 415
    assert post(url, sample_request(), **{"Content-Encoding": "br"})[0] == 415
    assert post(url, b"\x1f\x8b\x08garbage", **{"Content-Encoding": "gzip"})[0] == 400
    assert post(url, b"x" * (1 << 20 + 1))[0] == 413
    bomb = gzip.compress(b"\0" * (3 << 20))
    assert post(url, bomb, **{"Content-Encoding": "gzip"})[0] == 413
    assert post(url.replace("/v1/traces", "/v1/logs"), sample_request())[0] == 404
    head = (
        b"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-protobuf\r\n"
        b"Content-Length: 500\r\n\r\n"
    )
    assert _raw_http(collector.receiver.http_port, head, sample_request()[:20]) == 400
    # still serving, and nothing bad was stored
    assert post(url, sample_request(3, 7))[0] == 200
    collector.close()
    assert sorted(int(k, 16) for k in stored(collector.out)) == [7, 8, 9]
    assert collector.receiver.stats.errors == 10


def test_bad_ids_are_rejected_as_partial_success(collector: Collector) -> None:
    req = ExportTraceServiceRequest.FromString(sample_request(3, 1))
    req.resource_spans[0].scope_spans[0].spans[1].span_id = b"\x01\x02"
    status, resp = post(collector.url, req.SerializeToString())
    assert status == 200
    assert ExportTraceServiceResponse.FromString(resp).partial_success.rejected_spans == 1


def test_grpc_errors(collector: Collector) -> None:
    with grpc.insecure_channel(collector.grpc_target) as ch:
        call = ch.unary_unary(GRPC_METHOD)
        with pytest.raises(grpc.RpcError) as e:
            call(b"\x0a\xff\xff\xff", timeout=60)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        with pytest.raises(grpc.RpcError) as e:
            call(b"\x0a" + b"x" * (2 << 20), timeout=60)
        assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert ExportTraceServiceResponse.FromString(call(sample_request(), timeout=60)) is not None


def test_partition_by_date_and_host(tmp_path: Path) -> None:
    c = Collector(tmp_path / "p", partition_by=("date", "host"))
    try:
        run_sender("--http", c.url, "--spans", "20")
        assert post(c.url, sample_request(3, 500))[0] == 200  # no host.name, start in 1970
    finally:
        c.close()
    parts = {
        p.parent.relative_to(tmp_path / "p" / "spans").as_posix()
        for p in (tmp_path / "p" / "spans").rglob("*.parquet")
    }
    assert len(parts) == 2
    assert "date=1970-01-01/host=__HIVE_DEFAULT_PARTITION__" in parts
    (other,) = parts - {"date=1970-01-01/host=__HIVE_DEFAULT_PARTITION__"}
    assert other.startswith("date=20") and other.endswith("/host=node7")
    rows = stored(tmp_path / "p")
    assert len(rows) == 23
    assert {r["host"] for r in rows.values()} == {"node7", None}


def request_from(service: str, host: str | None, first: int, n: int = 10) -> bytes:
    req = ExportTraceServiceRequest.FromString(sample_request(n, first))
    resource = req.resource_spans[0].resource
    del resource.attributes[:]
    for key, value in (("service.name", service), ("host.name", host)):
        if value is not None:
            kv = resource.attributes.add()
            kv.key, kv.value.string_value = key, value
    return req.SerializeToString()


def test_partition_by_service_keeps_every_value_and_every_span(tmp_path: Path) -> None:
    """A 300-character service name once raised ENAMETOOLONG mid-batch and cost other
    services' acknowledged spans; names with spaces came back from the folder names."""
    c = Collector(tmp_path / "p", partition_by=("service", "host"))
    senders = [("s" * 300, "node1"), ("payment service", "node 2"), ("checkout", "a/b"), ("x", "")]
    try:
        for i, (service, host) in enumerate(senders):
            assert post(c.url, request_from(service, host, 1 + 100 * i))[0] == 200
    finally:
        summary = c.close()
    assert summary.stored == 40 and summary.unwritten == 0
    rows = stored(tmp_path / "p").values()
    assert sorted((r["service"], r["host"]) for r in rows) == sorted(
        (service, host) for service, host in senders for _ in range(10)
    )
    con = chiptrace.connect(tmp_path / "p")
    assert con.sql("SELECT count(*) FROM spans WHERE service = 'payment service'").fetchall() == [
        (10,)
    ]
    folders = [p.parent for p in (tmp_path / "p" / "spans").rglob("*.parquet")]
    assert all(len(f.name) <= 200 and len(f.parent.name) <= 200 for f in folders)
    assert {f.parent.name for f in folders} >= {"service=payment%20service", "service=checkout"}


def test_receiver_class_reusable_with_a_callback() -> None:
    got: list[pa.RecordBatch] = []
    with OtlpReceiver(got.append, http="127.0.0.1:0") as r:
        assert post(f"http://127.0.0.1:{r.http_port}/v1/traces", sample_request(4))[0] == 200
    assert sum(b.num_rows for b in got) == 4 and r.stats.spans == 4


@pytest.mark.parametrize(
    ("command", "sig", "ignored"),
    [
        ("collect", signal.SIGTERM, False),
        ("view", signal.SIGTERM, False),
        ("view", signal.SIGINT, False),
        ("view", signal.SIGINT, True),
    ],
)
def test_a_signal_keeps_every_acknowledged_span(
    tmp_path: Path, command: str, sig: signal.Signals, ignored: bool
) -> None:
    """`collect` and `view --otlp --out DIR` stop on SIGTERM / SIGINT with every span they
    acknowledged stored, and say how many they stored; SIGINT too when the parent ignored
    it (view --otlp ran on forever then, and its test waited out its timeout)."""
    out = tmp_path / "sig"
    flags = ["--flush-interval", "60"] if command == "collect" else []
    proc, url = start_collect(out, *flags, command=command, ignore_sigint=ignored)
    acked: list[int] = []
    stop = threading.Event()

    def client(i: int) -> None:
        while not stop.is_set():
            try:
                status, _ = post(url, sample_request(50, i))
            except OSError:
                return
            if status == 200:
                acked.extend(range(i, i + 50))
            i += 50

    threads = [threading.Thread(target=client, args=(1 + k * 10_000_000,)) for k in range(3)]
    for t in threads:
        t.start()
    wait_until(lambda: len(acked) >= 1000, "1000 acknowledged spans", timeout_s=120)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)  # drain stderr: a full pipe would block the collector
    stop.set()
    for t in threads:
        t.join(timeout=30)
    assert proc.returncode == 0, err[-2000:]
    ids = {int(k, 16) for k in stored(out)}
    assert set(acked) <= ids and len(acked) >= 1000
    assert stored_count_said(err) == len(ids)
    # The writer says it has finished, so a viewer following the directory shows ENDED.
    manifests = [json.loads(m.read_text()) for m in (out / "manifest").glob("*.json")]
    assert manifests and all(m.get("ended_unix_ns") for m in manifests)


def test_a_failing_callback_is_503_and_the_receiver_goes_on() -> None:
    calls = []

    def flaky(batch: pa.RecordBatch) -> None:
        calls.append(batch.num_rows)
        if len(calls) == 1:
            raise OSError("disk full")

    with OtlpReceiver(flaky, http="127.0.0.1:0") as r:
        url = f"http://127.0.0.1:{r.http_port}/v1/traces"
        assert post(url, sample_request(2))[0] == 503
        assert post(url, sample_request(2))[0] == 200
    assert calls == [2, 2] and r.stats.refused == 1 and r.stats.spans == 2


def test_cli_errors_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from chiptrace.cli import main

    assert main(["collect", "--out", str(tmp_path / "x"), "--partition-by", "date,planet"]) == 2
    assert "unknown key 'planet'" in capsys.readouterr().err
    assert main(["collect", "--out", str(tmp_path / "x"), "--listen", "127.0.0.1:99999"]) == 2
    assert "--listen '127.0.0.1:99999'" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()
    for flags, said in (
        (["--max-memory-mb", "100"], "--max-memory-mb 100: expected at least 384"),
        (["--flush-spans", "0"], "--flush-spans 0: expected a positive number"),
        (["--read-timeout", "-1"], "--read-timeout -1.0: expected a positive number"),
        (["--listen", "none"], "--listen none without --grpc: nothing to receive on"),
    ):
        assert main(["collect", "--out", str(tmp_path / "x"), *flags]) == 2
        err = capsys.readouterr().err
        assert said in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "x").exists()
