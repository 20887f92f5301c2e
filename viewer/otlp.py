"""A minimal OTLP/HTTP receiver for the viewer: POST /v1/traces -> span batches.

Any OpenTelemetry SDK's OTLP/HTTP exporter (protobuf or JSON, gzip or not) can point at
it. Each request is decoded into one Arrow batch of the span schema (chip/link/op
attributes become their columns, the rest stays in `attributes`) and handed to the viewer's
feed at once, and to a recorder that stores it as Parquet parts (in `--out DIR`, or in a
temporary dir the explorer and SQL console read, removed at exit).
"""

from __future__ import annotations

import gzip
import logging
import shutil
import tempfile
import threading
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pyarrow as pa
from chiptrace.viewer.sources import SpanFeed
from google.protobuf import json_format
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

from chiptrace.config import resolve
from chiptrace.errors import ChiptraceError
from chiptrace.recorder import Recorder, StoreSink
from chiptrace.schema import ATTRIBUTE_COLUMNS, batch_from_columns, dumps, trace_ids_to_binary
from chiptrace.store import PartWriter, read_manifests

log = logging.getLogger("chiptrace")
MAX_BODY = 64 << 20


class OtlpAddressError(ChiptraceError):
    """A --otlp address that is not HOST:PORT."""


def parse_address(text: str) -> tuple[str, int]:
    """`HOST:PORT`, `:PORT` or `PORT` (host 127.0.0.1); port 0 picks a free one.

    Raises:
        OtlpAddressError: not a host and a port in 0..65535.
    """
    host, sep, port = text.rpartition(":")
    if not sep:
        host, port = "", text
    try:
        p = int(port)
    except ValueError:
        p = -1
    if not 0 <= p <= 65535:
        raise OtlpAddressError(f"--otlp {text!r}: expected HOST:PORT, for example 127.0.0.1:4318")
    return host.strip("[]") or "127.0.0.1", p


def _any(v: Any) -> Any:
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [_any(x) for x in v.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: _any(kv.value) for kv in v.kvlist_value.values}
    if kind == "bytes_value":
        return v.bytes_value.hex()
    return getattr(v, kind) if kind else None


def decode_request(req: trace_service_pb2.ExportTraceServiceRequest) -> pa.RecordBatch:
    """One OTLP export request as a span batch."""
    cols: dict[str, list] = {k: [] for k in (
        "trace_id", "span_id", "parent_span_id", "name", "kind", "start_ns", "end_ns",
        "status_code", "status_message", "service", "host", "pid", "scope", "resource",
        "attributes", "events", "links", *ATTRIBUTE_COLUMNS.values())}  # fmt: skip
    for rs in req.resource_spans:
        res = {kv.key: _any(kv.value) for kv in rs.resource.attributes}
        res_json = dumps(res)
        pid = res.get("process.pid")
        for ss in rs.scope_spans:
            for sp in ss.spans:
                attrs = {kv.key: _any(kv.value) for kv in sp.attributes}
                for key, col in ATTRIBUTE_COLUMNS.items():
                    v = attrs.pop(key, None)
                    cols[col].append(v if col not in ("op_bytes", "op_flops") or v is None else int(v))
                cols["trace_id"].append(bytes(sp.trace_id).rjust(16, b"\0")[:16])
                cols["span_id"].append(bytes(sp.span_id).rjust(8, b"\0")[:8])
                cols["parent_span_id"].append(bytes(sp.parent_span_id) or None)
                cols["name"].append(sp.name)
                cols["kind"].append(sp.kind)
                cols["start_ns"].append(sp.start_time_unix_nano)
                cols["end_ns"].append(max(sp.end_time_unix_nano, sp.start_time_unix_nano))
                cols["status_code"].append(sp.status.code)
                cols["status_message"].append(sp.status.message or None)
                cols["service"].append(res.get("service.name"))
                cols["host"].append(res.get("host.name"))
                cols["pid"].append(int(pid) if isinstance(pid, int) else None)
                cols["scope"].append(ss.scope.name or None)
                cols["resource"].append(res_json)
                cols["attributes"].append(dumps(attrs))
                cols["events"].append(dumps([{"name": e.name, "time_unix_nano": e.time_unix_nano,
                                              "attributes": {kv.key: _any(kv.value) for kv in e.attributes}}
                                             for e in sp.events]) if sp.events else None)  # fmt: skip
                cols["links"].append(dumps([{"trace_id": bytes(lk.trace_id).hex(), "span_id": bytes(lk.span_id).hex()}
                                            for lk in sp.links]) if sp.links else None)  # fmt: skip
    n = len(cols["name"])
    cols["trace_id"] = trace_ids_to_binary(cols["trace_id"])
    cols["span_id"] = pa.array(cols["span_id"], pa.binary(8))
    cols["parent_span_id"] = pa.array(cols["parent_span_id"], pa.binary(8))
    return batch_from_columns(cols, n)


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib name
        pass  # the TUI owns the terminal

    def do_POST(self) -> None:  # noqa: N802 - stdlib name
        if self.path.rstrip("/") != "/v1/traces":
            self._reply(404, b"not found: POST /v1/traces")
            return
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_BODY:
            self._reply(413, b"request too large")
            return
        body = self.rfile.read(length)
        try:
            if self.headers.get("Content-Encoding", "").lower() == "gzip":
                body = gzip.decompress(body)
            if "json" in self.headers.get("Content-Type", ""):
                req = json_format.Parse(body, trace_service_pb2.ExportTraceServiceRequest())
            else:
                req = trace_service_pb2.ExportTraceServiceRequest.FromString(body)
            batch = decode_request(req)
        except (DecodeError, json_format.ParseError, OSError, zlib.error, ValueError) as e:
            self.server.source.bad_requests += 1
            self._reply(400, f"bad OTLP request: {e}".encode())
            return
        self.server.source.take(batch)
        self._reply(200, trace_service_pb2.ExportTraceServiceResponse().SerializeToString(),
                    "application/x-protobuf")  # fmt: skip

    def _reply(self, code: int, body: bytes, ctype: str = "text/plain") -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    source: OtlpSource


class OtlpSource:
    """Receives OTLP/HTTP on host:port; a viewer source (see `sources.Source`).

    Args:
        host, port: where to listen (port 0: a free port, read `.port`).
        out: a trace dir to store the spans in; None stores into a temporary dir.
    """

    def __init__(self, host: str = "127.0.0.1", port: int = 4318, out: str | Path | None = None) -> None:
        self.feed = SpanFeed()
        self.bad_requests = 0
        self._tmp = None if out else tempfile.mkdtemp(prefix="chiptrace-view-")
        self.store_dir = Path(out or self._tmp)
        try:
            self._server = _Server((host, port), _Handler)
        except OSError as e:
            raise OtlpAddressError(f"cannot listen on {host}:{port}: {e.strerror}") from e
        self._server.source = self
        self.port = self._server.server_address[1]
        self.name = f"otlp {host}:{self.port}"
        self.writer = PartWriter(self.store_dir, manifest={"source": "chiptrace view --otlp"})
        config = resolve(dir=self.store_dir, service="chiptrace-view", flush_interval_s=1.0)
        self.recorder = Recorder(config, [StoreSink(self.writer)], self.writer)
        self._thread = threading.Thread(target=self._server.serve_forever, name="chiptrace-otlp",
                                        daemon=True)  # fmt: skip
        self._thread.start()

    def take(self, batch: pa.RecordBatch) -> None:
        """A decoded request: to the screen now, to the store on the next flush."""
        if batch.num_rows:
            self.feed.write(batch)
            self.recorder.write_batch(batch, block=False)

    def poll(self, feed: SpanFeed) -> None:
        if feed is not self.feed:  # a viewer with its own feed: forward
            for b in self.feed.drain():
                feed.write(b)

    def manifests(self) -> list[dict[str, Any]]:
        return read_manifests([self.store_dir])

    def serve_summary(self, window_ns: int | None) -> int:
        """--no-ui: receive until interrupted, then print the dashboard as text."""
        import time

        from chiptrace.viewer.alerts import derive_alerts
        from chiptrace.viewer.launch import summary_text
        from chiptrace.viewer.model import LiveModel

        model = LiveModel()
        print(f"chiptrace: receiving OTLP/HTTP on http://127.0.0.1:{self.port}/v1/traces (Ctrl-C ends)")
        try:
            while True:
                time.sleep(0.2)
                for b in self.feed.drain():
                    model.ingest(b)
        except KeyboardInterrupt:
            pass
        snap = model.snapshot(window_ns or 1_000_000_000)
        print(summary_text(snap, derive_alerts(snap)))
        return 0

    def stop(self) -> None:
        """Stop listening, store what is buffered, remove a temporary store."""
        self._server.shutdown()
        self._server.server_close()
        self.recorder.shutdown()
        if self._tmp:
            shutil.rmtree(self._tmp, ignore_errors=True)


__all__ = ["OtlpSource", "decode_request", "parse_address"]
