"""HTTP connections of the OTLP receiver: how many, from whom, and how fast they must send.

`OtlpHttpServer` holds at most `max_connections` open, and at most `per_client` from one
client address (so one client trickling bytes into every slot cannot lock the others out);
more get 503 and are closed, and each refusal is counted. `DeadlineReader` is a
connection's socket whose reads keep its deadlines: an idle wait for a request, a whole
header by a fixed time from its first byte, a body by a minimum average rate.
"""

from __future__ import annotations

import io
import socket
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


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
