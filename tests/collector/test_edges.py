"""Edge answers over HTTP: methods, lengths, TLS, trickling clients and the per-client cap."""

from __future__ import annotations

import json
import logging
import socket
import time
from pathlib import Path

import grpc
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from tests.collector.test_collect import (
    GRPC_METHOD,
    Collector,
    _to_otlp_json,
    post,
    sample_request,
    stored,
)
from tests.collector.test_http import HEAD, exchange
from tests.waiting import wait_until


@pytest.fixture
def port(tmp_path: Path):  # type: ignore[no-untyped-def]
    c = Collector(tmp_path / "c", read_timeout_s=5.0)
    yield c.receiver.http_port
    c.close()


def test_get_is_405_with_allow(port: int) -> None:
    status, body = exchange(port, b"GET /v1/traces HTTP/1.1\r\nHost: x\r\n\r\n")
    assert status == 405 and b"POST" in body


@pytest.mark.parametrize(
    "lengths",
    [[b"\xb2"], [b"1e3"], [b"-1"], [b"0x10"], [b"10", b"12"]],
    ids=["superscript-two", "exponent", "negative", "hex", "conflicting"],
)
def test_malformed_or_conflicting_lengths_are_400(port: int, lengths: list[bytes]) -> None:
    head = HEAD.encode() + b"".join(b"Content-Length: %s\r\n" % v for v in lengths)
    status, body = exchange(port, head + b"\r\n" + b"x" * 12)
    assert status == 400, body


def test_length_and_chunked_together_are_400(port: int) -> None:
    head = HEAD.encode() + b"Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n"
    assert exchange(port, head + b"0\r\n\r\n")[0] == 400


def test_a_tls_handshake_is_closed_at_once_with_a_hint(
    port: int, caplog: pytest.LogCaptureFixture
) -> None:
    hello = bytes.fromhex("16030100a5010000a10303") + bytes(160)  # a ClientHello's start
    t0 = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="chiptrace"):
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            s.sendall(hello)
            assert s.recv(100) == b""  # closed, not held until the 5 s read timeout
    assert time.monotonic() - t0 < 3
    wait_until(lambda: "TLS" in caplog.text, "the log line")
    assert "plain HTTP" in caplog.text and "TLS-terminating proxy" in caplog.text


def trickle(n: int, port: int, source: str) -> list[socket.socket]:
    """`n` connections from `source` that send a request's first bytes and then stall."""
    socks = []
    for _ in range(n):
        s = socket.socket()
        s.bind((source, 0))
        s.settimeout(10)
        s.connect(("127.0.0.1", port))
        s.sendall(b"P")
        socks.append(s)
    return socks


def test_trickling_clients_do_not_lock_out_real_posts(tmp_path: Path) -> None:
    c = Collector(
        tmp_path / "t",
        max_connections=24,
        max_connections_per_client=8,
        header_timeout_s=1.0,
        read_timeout_s=30.0,
    )
    port = c.receiver.http_port
    try:
        tricklers = trickle(24, port, "127.0.0.2")  # another loopback address: another client
        try:
            wait_until(lambda: c.receiver.http_connections >= 8, "the per-client cap filled")
            for _ in range(8):  # real posts from 127.0.0.1 get in beside them
                assert post(c.url, sample_request(5, 1))[0] == 200
            # The 8 admitted tricklers are closed by the header deadline, not the 30 s idle one.
            t0 = time.monotonic()
            for s in tricklers:
                try:
                    while s.recv(1024):
                        pass
                except OSError:
                    pass
            assert time.monotonic() - t0 < 10
        finally:
            for s in tricklers:
                s.close()
    finally:
        summary = c.close()
    assert summary.refused >= 16  # the tricklers past the cap: 503, counted
    assert "refused with 503" in summary.line()


def test_a_body_slower_than_the_minimum_rate_gets_408(tmp_path: Path) -> None:
    from chiptrace.collector.receiver import OtlpReceiver

    with OtlpReceiver(
        lambda batch: None, http="127.0.0.1:0", min_body_rate=100_000, body_grace_s=0.5
    ) as r:
        head = HEAD.encode() + b"Content-Length: 1000000\r\n\r\n"
        t0 = time.monotonic()
        with socket.create_connection(("127.0.0.1", r.http_port), timeout=10) as s:
            s.sendall(head)
            answer = b""
            for _ in range(100):  # 1 kB every 0.05 s: 20 kB/s, under the 100 kB/s asked
                try:
                    s.sendall(b"x" * 1000)
                except OSError:
                    break
                s.settimeout(0.05)
                try:
                    answer = s.recv(100)
                except TimeoutError:
                    continue
                break
        assert answer.startswith(b"HTTP/1.1 408"), answer
        assert time.monotonic() - t0 < 3


def _bad_utf8_request(first_id: int) -> bytes:
    """Two spans whose resource (service, host, another key and value) and scope name hold
    invalid UTF-8; every other field is fine."""
    req = ExportTraceServiceRequest.FromString(sample_request(2, first_id))
    rs = req.resource_spans[0]
    del rs.resource.attributes[:]
    for key, value in (("service.name", "SVC@"), ("host.name", "HOST@"), ("KEY@", "VAL@")):
        kv = rs.resource.attributes.add()
        kv.key, kv.value.string_value = key, value
    rs.scope_spans[0].scope.name, rs.scope_spans[0].scope.version = "SCOPE@", "1.0"
    return req.SerializeToString().replace(b"@", b"\xff")


def _bad_utf8_json(first_id: int) -> bytes:
    """The same as OTLP/JSON: raw invalid bytes, and an unpaired surrogate escape."""
    doc = json.loads(_to_otlp_json(sample_request(2, first_id)))
    rs = doc["resourceSpans"][0]
    rs["resource"] = {
        "attributes": [
            {"key": "service.name", "value": {"stringValue": "SVC@"}},
            {"key": "host.name", "value": {"stringValue": "HOST\udc00"}},
        ]
    }
    rs["scopeSpans"][0]["scope"] = {"name": "SCOPE@"}
    return json.dumps(doc).encode().replace(b"@", b"\xff")


def test_invalid_utf8_in_resource_and_scope_costs_the_value(tmp_path: Path) -> None:
    """Over HTTP protobuf, HTTP JSON and gRPC: the spans are stored with U+FFFD where the
    bytes were bad (as in a span name), and the partial-success message counts them."""
    c = Collector(tmp_path / "c")
    try:
        status, resp = post(c.url, _bad_utf8_request(10))
        assert status == 200
        message = ExportTraceServiceResponse.FromString(resp).partial_success
        assert message.rejected_spans == 0
        assert "5 string(s) with invalid UTF-8 stored with U+FFFD" in message.error_message
        status, resp = post(c.url, _bad_utf8_json(20), "application/json")
        assert status == 200
        partial = json.loads(resp)["partialSuccess"]
        assert "rejectedSpans" not in partial
        assert "3 invalid UTF-8 sequence(s) or unpaired surrogate(s)" in partial["errorMessage"]
        with grpc.insecure_channel(c.grpc_target) as ch:
            raw = ch.unary_unary(GRPC_METHOD)(_bad_utf8_request(30), timeout=60)
        assert (
            "5 string(s)"
            in ExportTraceServiceResponse.FromString(raw).partial_success.error_message
        )
    finally:
        c.close()
    rows = stored(c.out)
    assert sorted(int(k, 16) for k in rows) == [10, 11, 20, 21, 30, 31]
    for sid, row in rows.items():
        assert (row["service"], row["scope"]) == ("SVC\ufffd", "SCOPE\ufffd"), sid
        assert row["host"] == "HOST\ufffd", sid
        if int(sid, 16) < 20 or int(sid, 16) >= 30:
            assert json.loads(row["resource"])["KEY\ufffd"] == "VAL\ufffd"
