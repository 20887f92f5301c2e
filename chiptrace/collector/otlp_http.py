"""OTLP/HTTP transport: request bodies, the handler, and what each failure is answered with.

Every real client is served: bodies with a Content-Length or chunked (the OpenTelemetry JS
SDK streams its protobuf body with Transfer-Encoding: chunked), plain or gzip. Connections
(how many, from whom, how fast) are `http_conn`'s. A body's memory is taken from the budget
(budget.Reservation) before it is read, so many large requests at once are refused rather
than growing the process.
"""

from __future__ import annotations

import io
import json
import logging
import re
import socket
import zlib
from http.server import BaseHTTPRequestHandler
from typing import TYPE_CHECKING, Any

from chiptrace.collector.budget import DECODE_FACTOR, BudgetExhausted, Reservation
from chiptrace.collector.http_conn import ConnectionLimits, DeadlineReader, is_tls_hello

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
