"""OTLP/HTTP transport: the server, request bodies, and what each failure is answered with.

Every real client is served: bodies with a Content-Length or chunked (the OpenTelemetry JS
SDK streams its protobuf body with Transfer-Encoding: chunked), plain or gzip; a listen
backlog deep enough for hundreds of clients connecting at once; at most `max_connections`
open at a time (more get 503 and are closed). A connection that sends nothing for
`read_timeout_s` (a stalled client, a body shorter than its Content-Length) is closed, so
stalled clients cannot hold threads forever. Bodies are read into a memory reservation
(budget.Reservation), so many large requests at once wait or are refused rather than
growing the process.
"""

from __future__ import annotations

import io
import json
import logging
import re
import socket
import threading
import time
import zlib
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

from chiptrace.collector.budget import DECODE_FACTOR, BudgetExhausted, Reservation

if TYPE_CHECKING:
    from chiptrace.collector.receiver import OtlpReceiver

log = logging.getLogger("chiptrace")

TRACES_PATH = "/v1/traces"
_DRAIN_MAX = 256 << 20  # beyond this, an oversized body is not read: the connection closes
_PROTOBUF = ("application/x-protobuf", "application/protobuf")
_JSON = ("application/json",)
_INFLATE_STEP = 1 << 20
_MAX_CHUNK_LINE = 1024
_MAX_TRAILERS = 64
_DIGITS = re.compile(r"[0-9]{1,19}")  # ASCII only: str.isdigit() takes "\xb2" (a 500 once)
_HEX = re.compile(rb"[0-9A-Fa-f]{1,16}")


class RequestError(Exception):
    """A request to answer with `status` and a one-line reason (and Retry-After on 503)."""

    def __init__(
        self, status: int, reason: str, retry_after_s: int | None = None, close: bool = False
    ) -> None:
        super().__init__(reason)
        self.status = status
        self.retry_after_s = retry_after_s
        self.close = close


def _inflate(body: bytes, limit: int, reservation: Reservation | None) -> bytes:
    inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
    out: list[bytes] = []
    total = 0
    data = body
    try:
        while data and not inflater.eof:
            chunk = inflater.decompress(data, _INFLATE_STEP)
            data = inflater.unconsumed_tail
            total += len(chunk)
            if total > limit:
                raise RequestError(413, f"request inflates past the {limit}-byte limit")
            if reservation is not None:  # the body's decode share covers the first bytes
                reservation.need(len(body) + total * (1 + DECODE_FACTOR))
            out.append(chunk)
    except zlib.error as e:
        raise RequestError(400, f"bad gzip body: {e}") from None
    if not inflater.eof:
        raise RequestError(400, "truncated gzip body")
    if reservation is not None:
        reservation.base = len(body)
    return b"".join(out)


def _read_chunked(rfile: Any, limit: int, reservation: Reservation | None) -> bytes:
    """A `Transfer-Encoding: chunked` body (RFC 9112 section 7.1), trailers dropped."""
    parts: list[bytes] = []
    total = 0
    while True:
        line = rfile.readline(_MAX_CHUNK_LINE)
        if not line.endswith(b"\n"):
            raise RequestError(400, "truncated chunked body", close=True)
        size_text = line.split(b";", 1)[0].strip()
        if not _HEX.fullmatch(size_text):
            raise RequestError(400, f"bad chunk size line {line[:40]!r}", close=True)
        size = int(size_text, 16)
        if size == 0:
            break
        total += size
        if total > limit:
            raise RequestError(413, f"chunked request over the {limit}-byte limit", close=True)
        if reservation is not None:  # its size shows only as it arrives; never waited for
            reservation.grow(size)
        data = rfile.read(size)
        if len(data) < size or rfile.readline(_MAX_CHUNK_LINE) not in (b"\r\n", b"\n"):
            raise RequestError(400, "truncated chunked body", close=True)
        parts.append(data)
    for _ in range(_MAX_TRAILERS):
        if rfile.readline(_MAX_CHUNK_LINE) in (b"\r\n", b"\n", b""):
            break
    return b"".join(parts)


def read_body(
    headers: Any, rfile: Any, limit: int, reservation: Reservation | None = None
) -> bytes:
    """The request body, de-chunked and decompressed, within `limit` bytes. With a
    Content-Length, the memory to read and decode it is taken from `reservation` once,
    before it is read; a chunked or gzip body takes more as it shows, never waiting.

    Raises:
        RequestError: 400 a malformed length, two lengths, a truncated or broken body;
            411 without a length or chunked encoding, 413 over the limit, 415 an unknown
            encoding, 503 no memory for it now (the body is read and dropped first, so the
            client reads the answer).
        TimeoutError: the client stopped sending for the socket's timeout.
    """
    try:
        body = _read_raw(headers, rfile, limit, reservation)
        encoding = (headers.get("Content-Encoding") or "identity").strip().lower()
        if encoding == "gzip":
            return _inflate(body, limit, reservation)
        if encoding != "identity":
            raise RequestError(
                415, f"Content-Encoding {encoding!r} not supported; use gzip or none"
            )
        return body
    except BudgetExhausted as e:
        retry = reservation.budget.retry_after() if reservation is not None else 1
        raise RequestError(503, str(e), retry_after_s=retry, close=True) from None


def _drain(rfile: Any, n: int) -> bool:
    """Read and drop `n` body bytes (at most _DRAIN_MAX); whether all were read."""
    if n > _DRAIN_MAX:
        return False
    while n > 0 and (chunk := rfile.read(min(n, 1 << 20))):
        n -= len(chunk)
    return n == 0


def content_length(headers: Any) -> int | None:
    """The Content-Length, None without one.

    Raises:
        RequestError: 400 a value that is not ASCII digits, or several that differ.
    """
    values = headers.get_all("Content-Length") or []
    found = {v.strip() for v in values}
    if not found:
        return None
    if len(found) > 1:
        raise RequestError(
            400, f"conflicting Content-Length headers: {', '.join(sorted(found))}", close=True
        )
    text = found.pop()
    if not _DIGITS.fullmatch(text):
        raise RequestError(400, f"malformed Content-Length {text[:40]!r}", close=True)
    return int(text)


def _read_raw(headers: Any, rfile: Any, limit: int, reservation: Reservation | None) -> bytes:
    transfer = (headers.get("Transfer-Encoding") or "").strip().lower()
    n = content_length(headers)
    if transfer:
        if n is not None:  # RFC 9112 6.3: a request smuggling attempt, or a broken proxy
            raise RequestError(400, "both Transfer-Encoding and Content-Length", close=True)
        if transfer != "chunked":
            raise RequestError(
                411, f"Transfer-Encoding {transfer!r} not supported; use chunked", close=True
            )
        return _read_chunked(rfile, limit, reservation)
    if n is None:
        raise RequestError(411, "Content-Length or chunked encoding required", close=True)
    if n > limit:
        drained = _drain(rfile, n)  # so the client gets to read our answer
        raise RequestError(
            413, f"request of {n} bytes is over the {limit}-byte limit", close=not drained
        )
    if reservation is not None:
        try:  # the body and decoding it, taken once (a gzip body takes more as it inflates)
            reservation.need(n * (1 + DECODE_FACTOR))
        except BudgetExhausted as e:
            drained = _drain(rfile, n)
            raise RequestError(
                503, str(e), retry_after_s=reservation.budget.retry_after(), close=not drained
            ) from None
    body = rfile.read(n)
    if len(body) < n:
        raise RequestError(400, f"truncated body: {len(body)} of {n} bytes", close=True)
    return body


class ConnectionLimits:
    """What one HTTP connection may take: slots, time for headers, pace of a body.

    Args:
        max_connections: open at once, all clients together; more get 503 and are closed.
        per_client: open at once from one client address (so one client trickling bytes
            into every slot cannot lock the others out).
        idle_s: a connection that sends nothing this long is closed (keep-alive included).
        header_s: a request's line and headers must arrive within this, from their first
            byte (a client sending one byte every few seconds is closed).
        min_body_rate: bytes a second a body must average after `body_grace_s`.
    """

    def __init__(
        self,
        max_connections: int,
        per_client: int,
        idle_s: float,
        header_s: float = 10.0,
        min_body_rate: int = 1000,
        body_grace_s: float = 10.0,
    ) -> None:
        self.max_connections = max_connections
        self.per_client = per_client
        self.idle_s = idle_s
        self.header_s = header_s
        self.min_body_rate = min_body_rate
        self.body_grace_s = body_grace_s


class DeadlineReader(io.RawIOBase):
    """A connection's socket as a raw stream whose reads keep the connection's deadlines:
    a whole phase (the headers) by a fixed time, a body by a minimum average rate."""

    def __init__(self, sock: socket.socket, limits: ConnectionLimits) -> None:
        self.sock = sock
        self.limits = limits
        self._deadline = float("inf")
        self._then: float | None = None
        self._rate_from = 0.0
        self._rate_bytes = 0

    def readable(self) -> bool:
        return True

    def expect_headers(self) -> None:
        """Wait up to idle_s for a request's first byte; then header_s for the rest."""
        self._deadline = time.monotonic() + self.limits.idle_s
        self._then = self.limits.header_s
        self._rate_from = 0.0

    def expect_body(self) -> None:
        self._deadline = float("inf")
        self._then = None
        self._rate_from, self._rate_bytes = time.monotonic(), 0

    def readinto(self, buffer: Any) -> int:
        now = time.monotonic()
        left = min(self._deadline - now, self.limits.idle_s)
        if self._rate_from:
            lim = self.limits
            # When the body falls below the minimum rate, at the current count.
            behind_at = self._rate_from + max(
                lim.body_grace_s, self._rate_bytes / lim.min_body_rate
            )
            left = min(left, behind_at - now)
        if left <= 0:
            raise TimeoutError("the client is sending too slowly")
        self.sock.settimeout(left)
        n = self.sock.recv_into(buffer)
        if n and self._then is not None:
            self._deadline, self._then = time.monotonic() + self._then, None
        self._rate_bytes += n
        return n


class OtlpHttpServer(ThreadingHTTPServer):
    """A thread per connection, a deep listen backlog, and at most `max_connections`."""

    daemon_threads = True
    # The kernel caps this at net.core.somaxconn (4096 on current Linux); the default of
    # 5 reset 143 of 200 clients connecting at once.
    request_queue_size = 1024

    def __init__(
        self,
        address: tuple[str, int],
        handler: type[BaseHTTPRequestHandler],
        limits: ConnectionLimits,
        on_refused: Callable[[], None] = lambda: None,
    ) -> None:
        self.limits = limits
        self.on_refused = on_refused
        self.connections = 0
        self._per_client: dict[str, int] = {}
        self._count_lock = threading.Lock()
        super().__init__(address, handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        client = client_address[0] if isinstance(client_address, tuple) else ""
        with self._count_lock:
            mine = self._per_client.get(client, 0)
            full = self.connections >= self.limits.max_connections or mine >= self.limits.per_client
            if not full:
                self.connections += 1
                self._per_client[client] = mine + 1
        if full:
            self.on_refused()
            _refuse(request)
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._closed(client)
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._closed(client_address[0] if isinstance(client_address, tuple) else "")

    def _closed(self, client: str) -> None:
        with self._count_lock:
            self.connections -= 1
            left = self._per_client.get(client, 1) - 1
            if left > 0:
                self._per_client[client] = left
            else:
                self._per_client.pop(client, None)


def _refuse(sock: socket.socket) -> None:
    body = b"too many connections\n"
    try:
        sock.setblocking(False)
        sock.send(
            b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 1\r\nConnection: close\r\n"
            b"Content-Type: text/plain\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
        )
    except OSError:
        pass


def is_tls_hello(head: bytes) -> bool:
    """A TLS record header of a handshake (a ClientHello): 0x16, then version 3.x."""
    return len(head) >= 2 and head[0] == 0x16 and head[1] == 0x03


def handler_class(receiver: OtlpReceiver, limits: ConnectionLimits) -> type[BaseHTTPRequestHandler]:
    """The request handler of `receiver`'s HTTP server."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        server_version = "chiptrace-collect"
        timeout = limits.idle_s

        def log_message(self, *args: Any) -> None:
            pass

        def setup(self) -> None:
            super().setup()
            self.reader = DeadlineReader(self.connection, limits)
            self.rfile = io.BufferedReader(self.reader, 1 << 16)

        def handle(self) -> None:
            try:
                head = self.connection.recv(3, socket.MSG_PEEK)
            except OSError:
                return
            if is_tls_hello(head):  # answered at once, not held until the read timeout
                receiver.stats.fail(400)
                receiver.note_tls(self.client_address)
                return
            super().handle()

        def handle_one_request(self) -> None:
            self.reader.expect_headers()
            super().handle_one_request()

        def _not_allowed(self) -> None:
            receiver.stats.fail(405)
            self.close_connection = True  # a body we will not read may follow
            body = f"use POST {TRACES_PATH}\n".encode()
            try:
                self.send_response(405)
                self.send_header("Allow", "POST")
                self.send_header("Content-Type", "text/plain; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.send_header("Connection", "close")
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)
            except OSError:
                pass

        do_GET = do_HEAD = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = _not_allowed  # noqa: N815

        def _reply(
            self,
            status: int,
            body: bytes,
            ctype: str = "text/plain; charset=utf-8",
            retry_after_s: int | None = None,
        ) -> None:
            try:
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                if retry_after_s is not None:
                    self.send_header("Retry-After", str(retry_after_s))
                if self.close_connection:
                    self.send_header("Connection", "close")
                self.end_headers()
                self.wfile.write(body)
                self.wfile.flush()
            except OSError:  # the client left; nothing to tell it
                self.close_connection = True

        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            try:
                self._post()
            except RequestError as e:
                receiver.stats.fail(e.status)
                if e.close:
                    self.close_connection = True  # the unread body would poison the next request
                self._reply(e.status, (str(e) + "\n").encode(), retry_after_s=e.retry_after_s)
            except TimeoutError:
                receiver.stats.fail(408)
                self.close_connection = True
                self._reply(408, b"the request body stopped arriving\n")
            except OSError:  # the client went away mid-request
                receiver.stats.fail(400)
                self.close_connection = True
            except Exception:  # noqa: BLE001 - a bug here must cost one request, not the server
                log.exception("chiptrace: OTLP request failed")
                receiver.stats.fail(500)
                self.close_connection = True
                self._reply(500, b"internal error\n")

        def _post(self) -> None:
            if self.path.split("?", 1)[0] != TRACES_PATH:
                raise RequestError(404, f"POST OTLP traces to {TRACES_PATH}", close=True)
            ctype = (self.headers.get("Content-Type") or "").split(";", 1)[0].strip().lower()
            if ctype not in _PROTOBUF + _JSON:
                raise RequestError(
                    415,
                    f"Content-Type {ctype!r}: expected application/x-protobuf or application/json",
                    close=True,
                )
            self.reader.expect_body()
            with receiver.budget.reservation() as reservation:
                body = read_body(self.headers, self.rfile, receiver.max_request_bytes, reservation)
                decoded = receiver.handle(body, ctype, reservation)
            if ctype in _JSON:
                doc: dict[str, Any] = {}
                if decoded.message:
                    partial: dict[str, Any] = {"errorMessage": decoded.message}
                    if decoded.rejected:
                        partial["rejectedSpans"] = str(decoded.rejected)  # int64: a JSON string
                    doc["partialSuccess"] = partial
                self._reply(200, json.dumps(doc).encode(), "application/json")
            else:
                self._reply(200, receiver.response(decoded), "application/x-protobuf")

    return Handler
