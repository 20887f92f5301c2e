"""The collector's memory ceiling, split between what it holds, and a byte budget for requests.

A collector holds three things that grow with its input: requests being read and decoded,
spans acknowledged and not yet written (the spool), and the decode caches. `MemoryPlan`
divides one ceiling (`--max-memory`, default 1 GiB) between them; each part is bounded in
bytes, so no input (a flood of unique 10 MB attributes, 200 clients at once) takes the
process past it. `MemoryBudget` is the requests' share: a request reserves the bytes it
will need before it reads them, waits a while when others hold the budget, and is refused
(503, clients retry) when no room comes.
"""

from __future__ import annotations

import ctypes
import threading
import time
from dataclasses import dataclass
from types import TracebackType

from chiptrace.collector.wire import DEFAULT_CACHE_BYTES
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
    """No room in the budget came within the wait."""

    def __init__(self, used: int, limit: int) -> None:
        super().__init__(
            f"the collector is busy: {used >> 20} of {limit >> 20} MiB of request memory "
            "in use; retry"
        )


class MemoryBudget:
    """Bytes held by requests in flight, at most `limit` together.

    A request larger than the whole budget may still run, alone: refusing it forever
    would make a legal request impossible (max-request-bytes is checked elsewhere).
    """

    def __init__(self, limit: int, wait_s: float = 5.0) -> None:
        self.limit = limit
        self.wait_s = wait_s
        self.used = 0
        self._cond = threading.Condition()

    def acquire(self, n: int, deadline: float, own: int = 0) -> None:
        """Take `n` bytes, waiting until `deadline` (time.monotonic) for room; `own` is
        what the caller already holds (a request alone is never refused).

        Raises:
            BudgetExhausted: no room by the deadline.
        """
        with self._cond:
            while self.used > own and self.used + n > self.limit:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise BudgetExhausted(self.used, self.limit)
                self._cond.wait(left)
            self.used += n

    def release(self, n: int) -> None:
        with self._cond:
            self.used -= n
            self._cond.notify_all()

    def reservation(self) -> Reservation:
        """A per-request holder: `grow(n)` as the request needs more; all freed on exit."""
        return Reservation(self)


class Reservation:
    """What one request holds of a MemoryBudget (a context manager)."""

    def __init__(self, budget: MemoryBudget) -> None:
        self.budget = budget
        self.held = 0
        self.deadline = time.monotonic() + budget.wait_s

    def grow(self, n: int) -> None:
        """Hold `n` more bytes.

        Raises:
            BudgetExhausted: no room within the budget's wait (counted from the first grow).
        """
        if n > 0:
            self.budget.acquire(n, self.deadline, self.held)
            self.held += n

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
