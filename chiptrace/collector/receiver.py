"""OTLP receivers: OTLP/HTTP (protobuf, JSON, gzip, chunked) and OTLP/gRPC, handing batches on.

`OtlpReceiver(on_batch)` binds 127.0.0.1 by default, decodes each request into one span
RecordBatch and calls `on_batch(batch)`; the request is acknowledged only after on_batch
returns, so whatever a client saw acknowledged is in the caller's hands. Bad input never
takes the server down: an oversized body gets 413 (gRPC: RESOURCE_EXHAUSTED), one that
does not parse or nests too deep 400 (INVALID_ARGUMENT), an unknown content type or
encoding 415; an on_batch failure, or no memory to decode the request in, 503
(UNAVAILABLE) with a Retry-After, which OTLP clients honour and retry. The transports are
`otlp_http` and `otlp_grpc`; memory is `budget`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import pyarrow as pa
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

from chiptrace.collector.budget import (
    DECODE_FACTOR,
    BudgetExhausted,
    MemoryBudget,
    MemoryPlan,
    Reservation,
)
from chiptrace.collector.decode import Decoded, DecodeError, decode
from chiptrace.collector.http_conn import ConnectionLimits, OtlpHttpServer
from chiptrace.collector.otlp_grpc import GRPC_SERVICE, start_grpc
from chiptrace.collector.otlp_http import (
    TRACES_PATH,
    RequestError,
    handler_class,
    read_body,
)
from chiptrace.errors import ConfigError

log = logging.getLogger("chiptrace")

DEFAULT_MAX_REQUEST_BYTES = 16 << 20
DEFAULT_READ_TIMEOUT_S = 30.0
DEFAULT_MAX_CONNECTIONS = 1024
DEFAULT_HEADER_TIMEOUT_S = 10.0
# Apache's mod_reqtimeout default (MinRate=500) doubled: a body of 16 MiB may take 4.6 h at
# this rate, so only a client that trickles on purpose or is stuck is cut off.
DEFAULT_MIN_BODY_RATE = 1000
_LOG_INTERVAL_S = 5.0

__all__ = [
    "GRPC_SERVICE",
    "TRACES_PATH",
    "OtlpReceiver",
    "RequestError",
    "parse_address",
    "read_body",
]


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


class _Stats:
    """Requests answered: acknowledged (with their spans), refused with 503, bad."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.requests = self.spans = self.rejected = self.errors = self.refused = 0

    def add(self, spans: int = 0, rejected: int = 0) -> None:
        with self.lock:
            self.requests += 1
            self.spans += spans
            self.rejected += rejected

    def fail(self, status: int) -> None:
        """A request answered with `status` (503: refused, to be retried; else bad)."""
        with self.lock:
            self.requests += 1
            if status == 503:
                self.refused += 1
            else:
                self.errors += 1


class _ThrottledWarning:
    """One log line per interval with a count, not one per request: a busy client retrying
    against a full store would otherwise flood the log (and can block the server outright
    when stderr is a pipe nobody drains)."""

    def __init__(self, text: str) -> None:
        self.text = text
        self._count = 0
        self._last = -_LOG_INTERVAL_S
        self._lock = threading.Lock()

    def add(self, count: int, detail: str) -> None:
        now = time.monotonic()
        with self._lock:
            self._count += count
            if now - self._last < _LOG_INTERVAL_S:
                return
            self._last, count, self._count = now, self._count, 0
        log.warning(self.text, count, detail)


class OtlpReceiver:
    """OTLP/HTTP and/or OTLP/gRPC servers that turn each request into a span batch.

    Args:
        on_batch: called with each decoded RecordBatch (from server threads, concurrently);
            raising (StoreUnavailable's `retry_after_s` is used) or returning False is a 503.
        http: `HOST:PORT` for OTLP/HTTP, or None for none (port 0: any free port).
        grpc: `HOST:PORT` for OTLP/gRPC, or None.
        max_request_bytes: largest body accepted, compressed or not.
        request_memory: bytes all requests being read and decoded may hold together
            (default: the share of a 1 GiB ceiling, see budget.MemoryPlan).
        read_timeout_s: an HTTP connection that sends nothing this long is closed.
        max_connections: HTTP connections open at once; more get 503.
        max_connections_per_client: of those, from one client address (default a
            quarter); more get 503.
        header_timeout_s: a request's headers must arrive within this of their first byte.
        min_body_rate: bytes a second a body must average after its first `body_grace_s`.
    """

    def __init__(
        self,
        on_batch: Callable[[pa.RecordBatch], Any],
        *,
        http: str | None = "127.0.0.1:4318",
        grpc: str | None = None,
        max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
        request_memory: int | None = None,
        read_timeout_s: float = DEFAULT_READ_TIMEOUT_S,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
        max_connections_per_client: int | None = None,
        header_timeout_s: float = DEFAULT_HEADER_TIMEOUT_S,
        min_body_rate: int = DEFAULT_MIN_BODY_RATE,
        body_grace_s: float = 10.0,
    ) -> None:
        self.on_batch = on_batch
        self.max_request_bytes = max_request_bytes
        self.read_timeout_s = read_timeout_s
        self.max_connections = max_connections
        self.max_connections_per_client = max_connections_per_client or max(1, max_connections // 4)
        self.header_timeout_s = header_timeout_s
        self.min_body_rate = min_body_rate
        self.body_grace_s = body_grace_s
        limit = request_memory or MemoryPlan.for_ceiling(1 << 30).requests
        self.budget = MemoryBudget(limit)
        self.stats = _Stats()
        self._http_addr = parse_address("--listen", http, 4318) if http else None
        self._grpc_addr = parse_address("--grpc", grpc, 4317) if grpc else None
        self._httpd: OtlpHttpServer | None = None
        self._grpc_server: Any = None
        self.http_port: int | None = None
        self.grpc_port: int | None = None
        self._inflight = 0
        self._closing = False
        self._idle = threading.Condition()
        self._refusals = _ThrottledWarning(
            "chiptrace: refused %d spans (503) since the last warning: %s"
        )
        self._notes = _ThrottledWarning("chiptrace: %d request(s) since the last warning: %s")
        self._tls = _ThrottledWarning(
            "chiptrace: closed %d TLS connection(s) (last from %s): chiptrace collect speaks "
            "plain HTTP; use an http:// endpoint, or put a TLS-terminating proxy (an "
            "OpenTelemetry Collector, nginx) in front"
        )

    def note_tls(self, client: Any) -> None:
        """A client opened with a TLS handshake (it was closed at once)."""
        self._tls.add(1, str(client[0]) if isinstance(client, tuple) else str(client))

    @property
    def http_url(self) -> str | None:
        """`http://HOST:PORT/v1/traces` once started with HTTP."""
        if not self.http_port or not self._http_addr:
            return None
        return f"http://{self._http_addr[0]}:{self.http_port}{TRACES_PATH}"

    @property
    def http_connections(self) -> int:
        """HTTP connections open now (each holds a thread until it closes or times out)."""
        return self._httpd.connections if self._httpd is not None else 0

    @property
    def grpc_target(self) -> str | None:
        """`HOST:PORT` of the gRPC server once started with gRPC."""
        if not self.grpc_port or not self._grpc_addr:
            return None
        return f"{self._grpc_addr[0]}:{self.grpc_port}"

    # ------------------------------------------------------------ lifecycle

    def start(self) -> OtlpReceiver:
        """Bind and serve in background threads.

        Raises:
            ConfigError: an address cannot be bound (in use, not local).
        """
        if self._http_addr:
            limits = ConnectionLimits(
                self.max_connections,
                self.max_connections_per_client,
                self.read_timeout_s,
                header_s=self.header_timeout_s,
                min_body_rate=self.min_body_rate,
                body_grace_s=self.body_grace_s,
            )
            handler = handler_class(self, limits)
            try:
                self._httpd = OtlpHttpServer(
                    self._http_addr, handler, limits, on_refused=lambda: self.stats.fail(503)
                )
            except OSError as e:
                raise ConfigError(
                    f"cannot listen on {self._http_addr[0]}:{self._http_addr[1]}: {e.strerror}"
                ) from e
            self.http_port = self._httpd.server_address[1]
            threading.Thread(
                target=self._httpd.serve_forever,
                args=(0.1,),  # the poll interval: stop() waits for it (0.5 s by default)
                name="chiptrace-otlp-http",
                daemon=True,
            ).start()
        if self._grpc_addr:
            try:
                self._grpc_server, self.grpc_port = start_grpc(self, *self._grpc_addr)
            except BaseException:
                self.stop(0)
                raise
        return self

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

    def handle(
        self, body: bytes, content_type: str, reservation: Reservation | None = None
    ) -> Decoded:
        """Decode one request body and hand its batch on; decoding's memory is reserved
        in `reservation` first.

        Raises:
            RequestError: 400 (malformed) or 503 (closing, no memory, on_batch failed).
        """
        with self._idle:
            if self._closing:
                raise RequestError(503, "the collector is shutting down", retry_after_s=5)
            self._inflight += 1
        try:
            if reservation is not None:  # a no-op where the length was known up front
                reservation.need(reservation.base + len(body) * (1 + DECODE_FACTOR))
            return self._handle(body, content_type, reservation)
        except BudgetExhausted as e:
            raise RequestError(503, str(e), retry_after_s=self.budget.retry_after()) from None
        finally:
            with self._idle:
                self._inflight -= 1
                self._idle.notify_all()

    def _handle(self, body: bytes, content_type: str, reservation: Reservation | None) -> Decoded:
        try:
            decoded = decode(body, content_type)
        except DecodeError as e:
            raise RequestError(400, str(e)) from None
        if reservation is not None:  # the body, the batch and its log record remain
            batch_bytes = decoded.batch.get_total_buffer_size()
            reservation.shrink(reservation.base + len(body) + 2 * batch_bytes)
        if decoded.note:
            self._notes.add(1, decoded.note)
        if decoded.batch.num_rows:
            try:
                if self.on_batch(decoded.batch) is False:
                    raise RuntimeError("the store's buffer is full or closing")
            except Exception as e:  # noqa: BLE001 - the client must hear it; the server goes on
                self._refusals.add(decoded.batch.num_rows, str(e))
                retry = getattr(e, "retry_after_s", None) or 1
                raise RequestError(503, f"could not store spans: {e}", retry) from None
        self.stats.add(decoded.batch.num_rows, decoded.rejected)
        return decoded

    @staticmethod
    def response(decoded: Decoded) -> bytes:
        """The serialized ExportTraceServiceResponse for a handled request."""
        resp = ExportTraceServiceResponse()
        if decoded.message:
            resp.partial_success.rejected_spans = decoded.rejected
            resp.partial_success.error_message = decoded.message
        return resp.SerializeToString()
