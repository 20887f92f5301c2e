"""The collector's memory ceiling, split between what it holds, and a byte budget for requests.

A collector holds three things that grow with its input: requests being read and decoded,
spans acknowledged and not yet written (the spool), and the decode caches. `MemoryPlan`
divides one ceiling (`--max-memory`, default 1 GiB) between them; each part is bounded in
bytes, so no input (a flood of unique 10 MB attributes, 200 clients at once) takes the
process past it. `MemoryBudget` is the requests' share, HTTP and gRPC together: a request
takes the bytes it will need (its body and decoding it) once, before it reads its body, and
is refused at once (503 / RESOURCE_EXHAUSTED, clients retry) when they do not fit.
"""

from __future__ import annotations

import collections
import ctypes
import secrets
import threading
import time
from dataclasses import dataclass
from types import TracebackType

from chiptrace.collector.span_reader import DEFAULT_CACHE_BYTES
from chiptrace.errors import ConfigError

DEFAULT_MAX_MEMORY = 1 << 30
# Not for input: an idle `chiptrace collect` (interpreter, pyarrow, protobuf, grpc, threads)
# measured 94 MiB RSS; the rest is for allocator slack (freed memory not yet returned).
BASE_BYTES = 192 << 20
MIN_MAX_MEMORY = 384 << 20
# What decoding costs per byte of request body, on top of the body, at its peak: measured
# 9x for one 10 MB attribute (the raw field, the protobuf value, the str, its JSON, the
# Arrow column: a 91 MB Python peak plus the 10 MB batch), 4x for SDK requests of 512
# small spans. The larger, so a flood of large values stays inside the budget.
DECODE_FACTOR = 10
_M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter
RETRY_SPREAD_S = 20
_TICKET_MARGIN = 1.2  # tickets a little later than measured: early ones are refused again
_MIN_TICKET_S = 0.05
_RECENT_S = 5.0


@dataclass(frozen=True)
class MemoryPlan:
    """Bytes each part of the collector may hold under a ceiling of `total`.

    The decode caches hold their fixed 32 MiB (wire.DEFAULT_CACHE_BYTES); requests and the
    spool get 2/5 each of what the base and the caches leave; the remaining 1/5 is headroom
    for writing a part (Parquet encodes a copy of at most `flush_bytes`).
    """

    total: int

    @classmethod
    def for_ceiling(cls, total: int) -> MemoryPlan:
        """The plan for a ceiling of `total` bytes.

        Raises:
            ConfigError: a ceiling too small to run in.
        """
        if total < MIN_MAX_MEMORY:
            raise ConfigError(
                f"--max-memory-mb {total >> 20}: expected at least {MIN_MAX_MEMORY >> 20}"
            )
        return cls(total)

    @property
    def _free(self) -> int:
        return self.total - BASE_BYTES - self.caches

    @property
    def requests(self) -> int:
        return self._free * 2 // 5

    @property
    def spool(self) -> int:
        return self._free * 2 // 5

    @property
    def flush_bytes(self) -> int:
        """The largest part written at once (its Parquet encoding needs about as much)."""
        return min(64 << 20, self.spool // 4)

    @property
    def caches(self) -> int:
        return DEFAULT_CACHE_BYTES


class BudgetExhausted(Exception):
    """No room in the budget now."""

    def __init__(self, used: int, limit: int, want: int) -> None:
        self.want = want
        super().__init__(
            f"the collector is busy: {used >> 20} of {limit >> 20} MiB of request memory "
            f"in use, {max(1, want >> 20)} MiB more needed; retry"
        )


class MemoryBudget:
    """Bytes held by requests in flight, HTTP and gRPC together, at most `limit`.

    Taking never waits: a request that waited for room while holding some (its body,
    waiting for its decode share) deadlocked with the others doing the same (80 requests
    of 10 MB, none acknowledged for minutes). A request takes what it will need once,
    before reading its body, and is refused at once (503 / RESOURCE_EXHAUSTED with a
    retry delay) when it does not fit. A request larger than the whole budget still runs
    when it is alone: refusing it forever would make a legal request impossible
    (max-request-bytes is checked elsewhere).
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0
        self.refused = 0
        self._recent: collections.deque[tuple[float, bool]] = collections.deque(maxlen=10_000)
        self._lock = threading.Lock()
        # Requests finished lately: (when, bytes held, seconds held), for retry tickets.
        self._held: collections.deque[tuple[float, int, float]] = collections.deque(maxlen=1000)
        self._slot = 0.0  # when the last refused request was told to come back

    def take(self, n: int, own: int = 0) -> None:
        """Take `n` bytes now; `own` is what the caller already holds.

        Raises:
            BudgetExhausted: no room now.
        """
        with self._lock:
            now = time.monotonic()
            if self.used > own and self.used + n > self.limit:
                self.refused += 1
                self._recent.append((now, False))
                raise BudgetExhausted(self.used, self.limit, n)
            self.used += n
            if not own:
                self._recent.append((now, True))

    def done(self, peak: int, seconds: float) -> None:
        """A request held up to `peak` bytes for `seconds` (what the next ones will too)."""
        if peak:
            with self._lock:
                self._held.append((time.monotonic(), peak, seconds))

    def retry_delay(self, want: int = 0) -> float:
        """Seconds a refused request of `want` bytes should wait: a ticket. Refused
        requests are queued in time, each after the one before by the time the budget
        takes to serve one of its size (its share of the budget times how long requests
        held their bytes lately, by bytes), so clients that come back when told find room
        and the budget does not sit idle between them (30 gRPC clients of 10 MB took 76 s
        retried at random, most coming back to a full budget, and 23 s with tickets). For
        gRPC, whose RetryInfo carries nanoseconds. Without recent requests to measure,
        spread at random as `retry_after`."""
        now = time.monotonic()
        with self._lock:
            while self._held and self._held[0][0] < now - 4 * _RECENT_S:
                self._held.popleft()
            weight = sum(b for _, b, _ in self._held)
            if want and weight:
                hold_s = sum(b * s for _, b, s in self._held) / weight
                step = min(want, self.limit) / self.limit * hold_s * _TICKET_MARGIN
                self._slot = min(max(self._slot, now) + step, now + RETRY_SPREAD_S)
                return max(_MIN_TICKET_S, self._slot - now)
        return float(self.retry_after())

    def retry_after(self) -> int:
        """Whole seconds a refused client should wait (HTTP's Retry-After): spread at random
        over as many seconds as requests were refused per one admitted lately (at most
        RETRY_SPREAD_S), so 100 clients retrying 10 MB bodies every second do not spend the
        CPU the admitted ones need on bodies that are refused again. Not a ticket: whole
        seconds bunch the clients told to come back within one second, and all but the
        first found the budget full again (17 of 80 HTTP clients unserved in 60 s)."""
        with self._lock:
            horizon = time.monotonic() - _RECENT_S
            while self._recent and self._recent[0][0] < horizon:
                self._recent.popleft()
            admitted = sum(1 for _, ok in self._recent if ok)
            refused = len(self._recent) - admitted
        spread = min(RETRY_SPREAD_S, max(2, refused // max(1, admitted)))
        return 1 + secrets.randbelow(spread)

    def release(self, n: int) -> None:
        with self._lock:
            self.used -= n

    def reservation(self) -> Reservation:
        """A per-request holder: `need(n)` before using n bytes; all freed on exit."""
        return Reservation(self)


class Reservation:
    """What one request holds of a MemoryBudget (a context manager)."""

    def __init__(self, budget: MemoryBudget) -> None:
        self.budget = budget
        self.held = 0
        self.base = 0  # bytes held besides the plain body and its decoding (a gzip body)
        self._peak = 0
        self._since = 0.0

    def need(self, total: int) -> None:
        """Hold at least `total` bytes in all (a no-op when already held).

        Raises:
            BudgetExhausted: the rest does not fit now.
        """
        if total > self.held:
            self.budget.take(total - self.held, self.held)
            if not self.held:
                self._since = time.monotonic()
            self.held = total
            self._peak = max(self._peak, total)

    def shrink(self, total: int) -> None:
        """Hold at most `total` bytes from now on (decoding is done: what is left is the
        body, the batch and its log record), so the next request can start meanwhile."""
        if total < self.held:
            self.budget.release(self.held - total)
            self.held = total

    def grow(self, n: int) -> None:
        """Hold `n` more bytes (a body whose size shows as it arrives: chunked, gzip).

        Raises:
            BudgetExhausted: it does not fit now.
        """
        self.need(self.held + n)

    def __enter__(self) -> Reservation:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self.held:
            self.budget.release(self.held)
            self.held = 0
        if self._peak and exc_type is None:
            self.budget.done(self._peak, time.monotonic() - self._since)


def limit_allocator_retention() -> None:
    """Have glibc serve every allocation of 1 MiB or more with its own mmap, for a process
    that receives large requests (`chiptrace collect`, `view --otlp`); a no-op elsewhere.

    glibc raises its mmap threshold to the largest block freed so far (up to 32 MiB), after
    which 10 MB request bodies come from per-thread heaps that keep the memory once it is
    freed: a flood of 80 requests of one unique 10 MB attribute peaked at 1,269 MB RSS
    with the default and at 816 MB with a fixed threshold (300 MB once idle). Small
    requests (512 spans are ~100 kB) are not affected.
    """
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # not glibc (macOS, Windows)
        return
    mallopt(_M_MMAP_THRESHOLD, 1 << 20)
