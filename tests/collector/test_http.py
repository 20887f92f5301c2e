"""OTLP/HTTP as real clients and broken ones send it: chunked, gzip, stalled, nested, mistaken."""

from __future__ import annotations

import gzip
import json
import logging
import socket
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import pyarrow as pa
import pytest
from google.rpc import error_details_pb2, status_pb2
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from chiptrace.collector.receiver import OtlpReceiver
from chiptrace.collector.spool import StoreUnavailable
from tests.collector.test_collect import GRPC_METHOD, Collector, post, sample_request, stored
from tests.collector.test_decode import _len
from tests.waiting import wait_until

HEAD = "POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-protobuf\r\n"


def chunked(body: bytes, size: int = 1000) -> bytes:
    """`body` in chunks of `size`, one with an extension, then a trailer."""
    out = b""
    for i in range(0, len(body), size):
        piece = body[i : i + size]
        ext = b";note=x" if i == 0 else b""
        out += b"%x%s\r\n%s\r\n" % (len(piece), ext, piece)
    return out + b"0\r\nX-Trailer: y\r\n\r\n"


def exchange(port: int, data: bytes, timeout_s: float = 30.0) -> tuple[int, bytes]:
    """Send raw bytes, return (status, body) of the one response."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as s:
        s.sendall(data)
        f = s.makefile("rb")
        status = int(f.readline().split()[1])
        length = 0
        while (line := f.readline()) not in (b"\r\n", b""):
            name, _, value = line.decode().partition(":")
            if name.lower() == "content-length":
                length = int(value)
        return status, f.read(length)


@pytest.fixture
def collector(tmp_path: Path) -> Iterator[Collector]:
    c = Collector(tmp_path / "c", read_timeout_s=0.5)
    yield c
    c.close()


def test_chunked_bodies_plain_and_gzip_are_stored(collector: Collector) -> None:
    port = collector.receiver.http_port
    plain = chunked(sample_request(5, 1))
    assert exchange(port, f"{HEAD}Transfer-Encoding: chunked\r\n\r\n".encode() + plain)[0] == 200
    zipped = chunked(gzip.compress(sample_request(4, 100)), size=7)
    head = f"{HEAD}Transfer-Encoding: chunked\r\nContent-Encoding: gzip\r\n\r\n".encode()
    assert exchange(port, head + zipped)[0] == 200
    collector.close()
    assert sorted(int(k, 16) for k in stored(collector.out)) == [1, 2, 3, 4, 5, 100, 101, 102, 103]


def test_broken_chunked_bodies_are_4xx(collector: Collector) -> None:
    port = collector.receiver.http_port
    head = f"{HEAD}Transfer-Encoding: chunked\r\n\r\n".encode()
    assert exchange(port, head + b"zz\r\nabc\r\n0\r\n\r\n")[0] == 400
    over = b"%x\r\n" % (2 << 20) + b"x" * 100
    assert exchange(port, head + over)[0] == 413  # over the 1 MiB limit: not read on
    assert exchange(port, f"{HEAD}Transfer-Encoding: gzip\r\n\r\n".encode())[0] == 411


def test_stalled_clients_are_closed_and_release_their_threads(collector: Collector) -> None:
    port = collector.receiver.http_port
    stalls = [
        HEAD.encode(),  # headers never finish
        f"{HEAD}Content-Length: 500\r\n\r\n".encode() + sample_request()[:20],  # short body
        f"{HEAD}Transfer-Encoding: chunked\r\n\r\n5\r\nab".encode(),  # a chunk cut off
        b"",  # connects, says nothing
    ]
    socks = []
    for i in range(40):
        s = socket.create_connection(("127.0.0.1", port), timeout=30)
        s.sendall(stalls[i % len(stalls)])
        socks.append(s)
    for s in socks:  # each is answered (408) or closed by the server: recv ends
        while s.recv(4096):
            pass
        s.close()
    wait_until(lambda: not collector.receiver.http_connections, "connections to close")
    assert post(collector.url, sample_request(2, 9))[0] == 200  # and it still serves


def test_deep_nesting_is_400_not_500(collector: Collector) -> None:
    deep_json = b'{"resourceSpans":' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    status, body = post(collector.url, deep_json, "application/json")
    assert status == 400 and b"nested too deep" in body
    value = b"\x0a\x00"  # AnyValue{string_value: ""}
    for _ in range(200):  # AnyValue{array_value: ArrayValue{values: [value]}}, 200 deep
        array = b"\x0a" + _len(value) + value
        value = b"\x2a" + _len(array) + array
    # a span whose attribute value nests past protobuf's recursion limit of 100: the value
    # is cut at 32 levels and counted; the span and the request are kept
    kv = b"\x0a\x01k\x12" + _len(value) + value
    span = b"\x0a\x10" + b"\x01" * 16 + b"\x12\x08" + b"\x02" * 8 + b"\x4a" + _len(kv) + kv
    ss = b"\x12" + _len(span) + span
    rs = b"\x12" + _len(ss) + ss
    status, body = post(collector.url, b"\x0a" + _len(rs) + rs)
    answer = ExportTraceServiceResponse.FromString(body)
    assert (
        status == 200 and "nested deeper than 32 levels cut" in answer.partial_success.error_message
    )
    assert post(collector.url, sample_request(1, 5))[0] == 200


def test_a_json_body_without_resource_spans_is_answered_with_a_hint(
    collector: Collector, caplog: pytest.LogCaptureFixture
) -> None:
    kineto = json.dumps({"schemaVersion": 1, "traceEvents": [{"ph": "X", "name": "k"}]})
    with caplog.at_level(logging.WARNING, logger="chiptrace"):
        status, body = post(collector.url, kineto.encode(), "application/json")
    assert status == 200
    message = json.loads(body)["partialSuccess"]["errorMessage"]
    assert "held no spans" in message and "chiptrace import FILE --out DIR" in message
    assert [r.getMessage() for r in caplog.records if "held no spans" in r.getMessage()] != []
    assert len(caplog.records) == 1
    assert post(collector.url, b"{}", "application/json") == (200, b"{}")
    status, body = post(collector.url, b"[]", "application/json")
    assert status == 400 and b"chiptrace import" in body


def test_refusals_carry_retry_after_over_http_and_grpc() -> None:
    def refuse(batch: pa.RecordBatch) -> None:
        raise StoreUnavailable("the disk is full", retry_after_s=7)

    with OtlpReceiver(refuse, http="127.0.0.1:0", grpc="127.0.0.1:0") as r:
        req = urllib.request.Request(
            r.http_url, data=sample_request(), headers={"Content-Type": "application/x-protobuf"}
        )
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(req, timeout=30)
        assert e.value.code == 503 and e.value.headers["Retry-After"] == "7"
        assert b"disk is full" in e.value.read()
        with grpc.insecure_channel(r.grpc_target) as ch:
            with pytest.raises(grpc.RpcError) as g:
                ch.unary_unary(GRPC_METHOD)(sample_request(), timeout=30)
    assert g.value.code() == grpc.StatusCode.UNAVAILABLE
    trailers = dict(g.value.trailing_metadata())
    info = error_details_pb2.RetryInfo.FromString(trailers["google.rpc.retryinfo-bin"])
    assert info.retry_delay.seconds == 7
    status = status_pb2.Status.FromString(trailers["grpc-status-details-bin"])
    assert status.code == grpc.StatusCode.UNAVAILABLE.value[0] and "disk is full" in status.message
    detail = error_details_pb2.RetryInfo()
    assert status.details[0].Unpack(detail) and detail.retry_delay.seconds == 7
    assert r.stats.refused == 2 and r.stats.errors == 0


def test_200_clients_at_once_are_all_served(tmp_path: Path) -> None:
    c = Collector(tmp_path / "many")
    start = threading.Barrier(200)
    results: list[object] = []

    def client(i: int) -> None:
        start.wait()
        try:
            results.append(post(c.url, sample_request(2, 1 + 2 * i))[0])
        except OSError as e:
            results.append(repr(e))

    threads = [threading.Thread(target=client, args=(i,)) for i in range(200)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    c.close()
    assert results == [200] * 200
    assert len(stored(c.out)) == 400


def test_connections_past_the_cap_get_503(tmp_path: Path) -> None:
    c = Collector(tmp_path / "cap", max_connections=3, max_connections_per_client=3)
    idle = [socket.create_connection(("127.0.0.1", c.receiver.http_port)) for _ in range(3)]
    try:
        wait_until(lambda: c.receiver.http_connections >= 3, "three open connections")
        assert exchange(c.receiver.http_port, b"")[0] == 503
    finally:
        for s in idle:
            s.close()
        c.close()


def test_grpc_and_http_protobuf_answer_the_same_partial_success(collector: Collector) -> None:
    req = ExportTraceServiceRequest.FromString(sample_request(3, 1))
    req.resource_spans[0].scope_spans[0].spans[0].trace_id = b"\x01"
    status, body = post(collector.url, req.SerializeToString())
    http = ExportTraceServiceResponse.FromString(body).partial_success
    with grpc.insecure_channel(collector.grpc_target) as ch:
        answer = ch.unary_unary(GRPC_METHOD)(req.SerializeToString(), timeout=30)
    assert status == 200 and http == ExportTraceServiceResponse.FromString(answer).partial_success
    assert http.rejected_spans == 1 and "trace id" in http.error_message
