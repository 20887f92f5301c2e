"""OTLP receivers: OTLP/HTTP (protobuf, JSON, gzip) and OTLP/gRPC, handing span batches on.

`OtlpReceiver(on_batch)` binds 127.0.0.1 by default, decodes each request into one span
RecordBatch and calls `on_batch(batch)`; the request is acknowledged only after on_batch
returns, so whatever a client saw acknowledged is in the caller's hands. Bad input never
takes the server down: an oversized body gets 413 (gRPC: RESOURCE_EXHAUSTED), one that
does not parse 400 (INVALID_ARGUMENT), an unknown content type or encoding 415, and an
on_batch failure 503 (UNAVAILABLE), which OTLP clients retry.
"""

from __future__ import annotations

import logging
import threading
import time
import zlib
from collections.abc import Callable
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pyarrow as pa
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

from chiptrace.collector.decode import Decoded, DecodeError, decode
from chiptrace.errors import ConfigError

log = logging.getLogger("chiptrace")

_REFUSAL_LOG_INTERVAL_S = 5.0

TRACES_PATH = "/v1/traces"
GRPC_SERVICE = "opentelemetry.proto.collector.trace.v1.TraceService"
DEFAULT_MAX_REQUEST_BYTES = 16 << 20
_DRAIN_MAX = 256 << 20  # beyond this, an oversized body is not read: the connection closes
_PROTOBUF = ("application/x-protobuf", "application/protobuf")
_JSON = ("application/json",)


class RequestError(Exception):
    """A request to answer with `status` and a one-line reason."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status


def parse_address(name: str, text: str, default_port: int) -> tuple[str, int]:
    """`HOST:PORT`, `:PORT` or `PORT` (host 127.0.0.1); port 0 picks a free one.

    Raises:
        ConfigError: not a host and a port in 0..65535.
    """
    host, sep, port = text.rpartition(":")
    if not sep:
        host, port = ("", text) if text.isdigit() else (text, str(default_port))
    try:
        p = int(port)
    except ValueError:
        p = -1
    if not 0 <= p <= 65535:
        raise ConfigError(
            f"{name} {text!r}: expected HOST:PORT, for example 127.0.0.1:{default_port}"
        )
    return host.strip("[]") or "127.0.0.1", p


def _response(decoded: Decoded) -> bytes:
    resp = ExportTraceServiceResponse()
    if decoded.rejected:
        resp.partial_success.rejected_spans = decoded.rejected
        resp.partial_success.error_message = decoded.reason
    return resp.SerializeToString()


class _Stats:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.requests = self.spans = self.rejected = self.errors = 0

    def add(self, spans: int = 0, rejected: int = 0, error: bool = False) -> None:
        with self.lock:
            self.requests += 1
            self.spans += spans
            self.rejected += rejected
            self.errors += int(error)


class OtlpReceiver:
    """OTLP/HTTP and/or OTLP/gRPC servers that turn each request into a span batch.

    Args:
        on_batch: called with each decoded RecordBatch (from server threads, concurrently).
        http: `HOST:PORT` for OTLP/HTTP, or None for none (port 0: any free port).
        grpc: `HOST:PORT` for OTLP/gRPC, or None.
        max_request_bytes: largest body accepted, compressed or not.
    """

    def __init__(
        self,
        on_batch: Callable[[pa.RecordBatch], Any],
        *,
        http: str | None = "127.0.0.1:4318",
        grpc: str | None = None,
        max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
    ) -> None:
        self.on_batch = on_batch
        self.max_request_bytes = max_request_bytes
        self.stats = _Stats()
        self._http_addr = parse_address("--listen", http, 4318) if http else None
        self._grpc_addr = parse_address("--grpc", grpc, 4317) if grpc else None
        self._httpd: ThreadingHTTPServer | None = None
        self._grpc_server: Any = None
        self.http_port: int | None = None
        self.grpc_port: int | None = None
        self._inflight = 0
        self._closing = False
        self._refused_spans = 0
        self._last_refusal_log = -_REFUSAL_LOG_INTERVAL_S
        self._idle = threading.Condition()

    # ------------------------------------------------------------ lifecycle

    def start(self) -> OtlpReceiver:
        """Bind and serve in background threads.

        Raises:
            ConfigError: an address cannot be bound (in use, not local).
        """
        if self._http_addr:
            try:
                self._httpd = ThreadingHTTPServer(self._http_addr, _handler(self))
            except OSError as e:
                raise ConfigError(
                    f"cannot listen on {self._http_addr[0]}:{self._http_addr[1]}: {e.strerror}"
                ) from e
            self._httpd.daemon_threads = True
            self.http_port = self._httpd.server_address[1]
            threading.Thread(
                target=self._httpd.serve_forever, name="chiptrace-otlp-http", daemon=True
            ).start()
        if self._grpc_addr:
            self._start_grpc()
        return self

    def _start_grpc(self) -> None:
        import grpc

        server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="chiptrace-otlp-grpc"),
            options=[("grpc.max_receive_message_length", self.max_request_bytes)],
        )
        handler = grpc.unary_unary_rpc_method_handler(self._grpc_export)  # raw bytes in and out
        server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler(GRPC_SERVICE, {"Export": handler}),)
        )
        host, port = self._grpc_addr
        try:
            self.grpc_port = server.add_insecure_port(f"{host}:{port}")
        except RuntimeError as e:
            raise ConfigError(f"cannot listen on {host}:{port} for gRPC: {e}") from e
        server.start()
        self._grpc_server = server

    def stop(self, grace_s: float = 5.0) -> None:
        """Stop acknowledging: later requests get 503 (or UNAVAILABLE), and this returns once
        every request already handing its spans on has done so (within `grace_s`). After it
        returns, on_batch is not called again, so the caller can flush what it was given."""
        with self._idle:
            self._closing = True
            self._idle.wait_for(lambda: self._inflight == 0, timeout=grace_s)
        if self._grpc_server is not None:
            self._grpc_server.stop(grace_s).wait(grace_s)
            self._grpc_server = None
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None

    def __enter__(self) -> OtlpReceiver:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    # ------------------------------------------------------------ requests

    def handle(self, body: bytes, content_type: str) -> Decoded:
        """Decode one request body and hand its batch on.

        Raises:
            RequestError: 400 (malformed) or 503 (on_batch failed).
        """
        with self._idle:
            if self._closing:
                raise RequestError(503, "the collector is shutting down")
            self._inflight += 1
        try:
            return self._handle(body, content_type)
        finally:
            with self._idle:
                self._inflight -= 1
                self._idle.notify_all()

    def _handle(self, body: bytes, content_type: str) -> Decoded:
        try:
            decoded = decode(body, content_type)
        except DecodeError as e:
            raise RequestError(400, str(e)) from None
        if decoded.batch.num_rows:
            try:
                if self.on_batch(decoded.batch) is False:
                    raise RuntimeError("the store's buffer is full or closing")
            except Exception as e:  # noqa: BLE001 - the client must hear it; the server goes on
                self._warn_refused(decoded.batch.num_rows, e)
                raise RequestError(503, f"could not store spans: {e}") from None
        self.stats.add(decoded.batch.num_rows, decoded.rejected)
        return decoded

    def _warn_refused(self, spans: int, error: Exception) -> None:
        """One warning per interval with a count, not one per request: a busy client
        retrying against a full store would otherwise flood the log (and can block the
        server outright when stderr is a pipe nobody drains)."""
        now = time.monotonic()
        with self._idle:
            self._refused_spans += spans
            if now - self._last_refusal_log < _REFUSAL_LOG_INTERVAL_S:
                return
            self._last_refusal_log, count, self._refused_spans = now, self._refused_spans, 0
        log.warning("chiptrace: refused %d spans (503) since the last warning: %s", count, error)

    def _grpc_export(self, request: bytes, context: Any) -> bytes:
        import grpc

        try:
            return _response(self.handle(request, "application/x-protobuf"))
        except RequestError as e:
            self.stats.add(error=True)
            code = (
                grpc.StatusCode.INVALID_ARGUMENT if e.status == 400 else grpc.StatusCode.UNAVAILABLE
            )
            context.abort(code, str(e))
            raise  # abort raises; this keeps type checkers honest


def read_body(headers: Any, rfile: Any, limit: int) -> bytes:
    """The request body, decompressed, within `limit` bytes.

    Raises:
        RequestError: 411 without a length, 413 over the limit, 415 an unknown encoding,
            400 a broken gzip stream.
    """
    raw_len = headers.get("Content-Length")
    if raw_len is None or not raw_len.strip().isdigit():
        raise RequestError(411, "Content-Length required")
    n = int(raw_len)
    if n > limit:
        if n <= _DRAIN_MAX:  # read and drop it, so the client gets to read our answer
            while n > 0 and (chunk := rfile.read(min(n, 1 << 20))):
                n -= len(chunk)
        raise RequestError(413, f"request of {raw_len} bytes is over the {limit}-byte limit")
    body = rfile.read(n)
    if len(body) < n:
        raise RequestError(400, f"truncated body: {len(body)} of {n} bytes")
    encoding = (headers.get("Content-Encoding") or "identity").strip().lower()
    if encoding == "gzip":
        inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
        try:
            body = inflater.decompress(body, limit + 1)
        except zlib.error as e:
            raise RequestError(400, f"bad gzip body: {e}") from None
        if len(body) > limit or inflater.unconsumed_tail:
            raise RequestError(413, f"request inflates past the {limit}-byte limit")
        if not inflater.eof:
            raise RequestError(400, "truncated gzip body")
    elif encoding != "identity":
        raise RequestError(415, f"Content-Encoding {encoding!r} not supported; use gzip or none")
    return body


def _handler(receiver: OtlpReceiver) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        server_version = "chiptrace-collect"

        def log_message(self, *args: Any) -> None:
            pass

        def _reply(
            self, status: int, body: bytes, ctype: str = "text/plain; charset=utf-8"
        ) -> None:
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            if self.close_connection:
                self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            try:
                self._post()
            except RequestError as e:
                receiver.stats.add(error=True)
                if e.status in (411, 413) or (e.status == 400 and "truncated" in str(e)):
                    self.close_connection = True  # the unread body would poison the next request
                self._reply(e.status, (str(e) + "\n").encode())
            except Exception:  # noqa: BLE001 - a bug here must cost one request, not the server
                log.exception("chiptrace: OTLP request failed")
                receiver.stats.add(error=True)
                self.close_connection = True
                self._reply(500, b"internal error\n")

        def _post(self) -> None:
            if self.path.split("?", 1)[0] != TRACES_PATH:
                self.close_connection = True
                raise RequestError(404, f"POST OTLP traces to {TRACES_PATH}")
            ctype = (self.headers.get("Content-Type") or "").split(";", 1)[0].strip().lower()
            if ctype not in _PROTOBUF + _JSON:
                self.close_connection = True
                raise RequestError(
                    415,
                    f"Content-Type {ctype!r}: expected application/x-protobuf or application/json",
                )
            body = read_body(self.headers, self.rfile, receiver.max_request_bytes)
            decoded = receiver.handle(body, ctype)
            if ctype in _JSON:
                resp = (
                    b"{}"
                    if not decoded.rejected
                    else (
                        b'{"partialSuccess":{"rejectedSpans":"%d","errorMessage":"%s"}}'
                        % (decoded.rejected, decoded.reason.encode())
                    )
                )
                self._reply(200, resp, "application/json")
            else:
                self._reply(200, _response(decoded), "application/x-protobuf")

    return Handler
