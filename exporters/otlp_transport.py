"""Sending serialized OTLP requests: HTTP/protobuf and gRPC, with retry and backoff.

Both transports take the bytes the encoder built and never re-serialize them (the gRPC
method is called with identity serializers). Retries follow the OTLP specification:
HTTP 429, 502, 503, 504 and gRPC UNAVAILABLE, RESOURCE_EXHAUSTED, DEADLINE_EXCEEDED,
ABORTED, CANCELLED, OUT_OF_RANGE and DATA_LOSS are transient, as is a refused or broken
connection; anything else fails at once. Backoff doubles from `backoff_s`, with jitter,
and honours an HTTP `Retry-After`.
"""

from __future__ import annotations

import gzip
import http.client
import logging
import random
import time
import urllib.parse
from typing import Any, Protocol

from chiptrace._version import __version__
from chiptrace.errors import ChiptraceError, ConfigError
from chiptrace.exporters.otlp_config import OtlpSettings

log = logging.getLogger("chiptrace")

GRPC_METHOD = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"
RETRYABLE_HTTP = frozenset({429, 502, 503, 504})
RETRYABLE_GRPC = frozenset(
    {
        "UNAVAILABLE",
        "RESOURCE_EXHAUSTED",
        "DEADLINE_EXCEEDED",
        "ABORTED",
        "CANCELLED",
        "OUT_OF_RANGE",
        "DATA_LOSS",
    }
)
MAX_BACKOFF_S = 8.0


class ExportError(ChiptraceError):
    """The OTLP endpoint failed for good (unreachable after retries, or rejected a request)."""

    exit_code = 1


class TransientError(Exception):
    """One attempt failed in a way worth retrying."""

    def __init__(self, reason: str, retry_after_s: float | None = None) -> None:
        super().__init__(reason)
        self.retry_after_s = retry_after_s


class Transport(Protocol):
    """Sends one serialized ExportTraceServiceRequest; raises TransientError or ExportError."""

    def send(self, body: bytes) -> int: ...

    def close(self) -> None: ...


def _rejected(response: bytes) -> int:
    """Spans the receiver reported as rejected (OTLP partial success)."""
    if not response:
        return 0
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

    try:
        msg = ExportTraceServiceResponse.FromString(response)
    except Exception:  # noqa: BLE001 - a receiver that answers junk still took the spans
        return 0
    if msg.partial_success.rejected_spans:
        log.warning(
            "chiptrace: receiver rejected %d spans: %s",
            msg.partial_success.rejected_spans,
            msg.partial_success.error_message,
        )
    return int(msg.partial_success.rejected_spans)


class HttpTransport:
    """OTLP/HTTP with protobuf bodies over one keep-alive connection."""

    def __init__(self, settings: OtlpSettings) -> None:
        self.settings = settings
        parsed = urllib.parse.urlsplit(settings.url)
        self.https = parsed.scheme == "https"
        self.host, self.port = parsed.hostname or "localhost", parsed.port
        self.path = parsed.path or "/v1/traces"
        self.headers = {
            "Content-Type": "application/x-protobuf",
            "User-Agent": f"chiptrace/{__version__}",
            **settings.headers,
        }
        if settings.compression == "gzip":
            self.headers["Content-Encoding"] = "gzip"
        self.conn: http.client.HTTPConnection | None = None

    def _connection(self) -> http.client.HTTPConnection:
        if self.conn is None:
            cls = http.client.HTTPSConnection if self.https else http.client.HTTPConnection
            self.conn = cls(self.host, self.port, timeout=self.settings.timeout_s)
        return self.conn

    def send(self, body: bytes) -> int:
        if self.settings.compression == "gzip":
            body = gzip.compress(body, compresslevel=5)
        try:
            conn = self._connection()
            conn.request("POST", self.path, body, self.headers)
            resp = conn.getresponse()
            data = resp.read()
        except (OSError, http.client.HTTPException) as e:
            self.close()
            raise TransientError(_os_reason(e)) from e
        if 200 <= resp.status < 300:
            return _rejected(data)
        if resp.will_close:
            self.close()
        reason = f"HTTP {resp.status} {resp.reason}"
        if resp.status in RETRYABLE_HTTP:
            raise TransientError(reason, _retry_after(resp.getheader("Retry-After")))
        detail = data[:200].decode("utf-8", "replace").strip().splitlines()
        raise ExportError(
            f"{self.settings.url} answered {reason}" + (f": {detail[0]}" if detail else "")
        )

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None


def _os_reason(e: BaseException) -> str:
    if isinstance(e, ConnectionRefusedError):
        return "connection refused"
    if isinstance(e, TimeoutError):
        return "timed out"
    return getattr(e, "strerror", None) or str(e) or type(e).__name__


def _retry_after(value: str | None) -> float | None:
    try:
        return max(0.0, float(value)) if value else None
    except ValueError:
        return None  # an HTTP date: fall back to our own backoff


class GrpcTransport:
    """OTLP/gRPC: the TraceService/Export unary call with pre-serialized requests."""

    def __init__(self, settings: OtlpSettings) -> None:
        try:
            import grpc
        except ImportError:
            raise ConfigError("grpc:// endpoints need grpcio: pip install grpcio") from None
        self._grpc = grpc
        self.settings = settings
        options = [("grpc.max_send_message_length", 64 << 20)]
        if settings.insecure:
            self.channel = grpc.insecure_channel(settings.target, options=options)
        else:
            creds = grpc.ssl_channel_credentials()
            self.channel = grpc.secure_channel(settings.target, creds, options=options)
        self.call = self.channel.unary_unary(GRPC_METHOD)  # bytes in, bytes out
        self.metadata = tuple((k.lower(), v) for k, v in settings.headers.items())
        self.compression = grpc.Compression.Gzip if settings.compression == "gzip" else None

    def send(self, body: bytes) -> int:
        try:
            data = self.call(
                body,
                timeout=self.settings.timeout_s,
                metadata=self.metadata or None,
                compression=self.compression,
            )
        except self._grpc.RpcError as e:
            code = e.code().name if hasattr(e, "code") else "UNKNOWN"
            detail = (
                (e.details() or "").splitlines()[0] if hasattr(e, "details") and e.details() else ""
            )
            reason = f"gRPC {code}" + (f" ({detail})" if detail else "")
            if code in RETRYABLE_GRPC:
                raise TransientError(reason) from e
            raise ExportError(f"{self.settings.url} answered {reason}") from e
        return _rejected(data)

    def close(self) -> None:
        self.channel.close()


def make_transport(settings: OtlpSettings) -> Transport:
    """The transport for `settings.protocol`."""
    return GrpcTransport(settings) if settings.protocol == "grpc" else HttpTransport(settings)


def send_with_retry(
    transport: Transport,
    body: bytes,
    *,
    retries: int = 5,
    backoff_s: float = 0.25,
    sleep: Any = time.sleep,
) -> int:
    """Send one request, retrying transient failures with exponential backoff.

    Returns:
        Spans the receiver rejected (OTLP partial success), usually 0.

    Raises:
        ExportError: a permanent failure, or still failing after `retries` retries.
    """
    for attempt in range(retries + 1):
        try:
            return transport.send(body)
        except TransientError as e:
            if attempt == retries:
                raise ExportError(f"{e} after {attempt + 1} attempt(s)") from e
            delay = min(MAX_BACKOFF_S, backoff_s * 2**attempt) * random.uniform(0.8, 1.2)
            if e.retry_after_s is not None:
                delay = min(MAX_BACKOFF_S, max(delay, e.retry_after_s))
            log.debug(
                "chiptrace: OTLP attempt %d failed (%s); retrying in %.2fs", attempt + 1, e, delay
            )
            sleep(delay)
    raise AssertionError("unreachable")
