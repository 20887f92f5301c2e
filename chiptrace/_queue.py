"""One bounded, drop-counting queue of batches, for producers that must never block.

The recorder's writer thread, the emulator and HTTP handlers hand batches to consumers
that can be slow (a screen, a remote collector). Blocking them would stall the workload,
so past `capacity` rows a `put` drops the batch and counts its rows, as the OpenTelemetry
SDK's BatchSpanProcessor does. Used by the viewer's SpanFeed and the live OTLP sink.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Sized
from typing import Generic, TypeVar

T = TypeVar("T", bound=Sized)  # a batch: len() is its row count (pa.RecordBatch, pa.Table)


class BoundedQueue(Generic[T]):
    """A FIFO of batches holding at most `capacity` rows; thread-safe.

    A consumer either drains everything at once (`drain`) or takes one batch at a time
    (`get`) and calls `task_done` when it is handled; `join` waits for that.
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.accepted = 0  # rows queued since the start
        self.dropped = 0  # rows refused (full, or closed)
        self._items: collections.deque[T] = collections.deque()
        self._rows = 0  # rows queued or taken and not done yet
        self._cond = threading.Condition()
        self._closed = False

    def put(self, item: T) -> bool:
        """Queue `item`, or drop and count it when it would pass the capacity. Never blocks."""
        n = len(item)
        with self._cond:
            if self._closed or self._rows + n > self.capacity:
                self.dropped += n
                return False
            self._items.append(item)
            self._rows += n
            self.accepted += n
            self._cond.notify_all()
            return True

    def get(self, timeout_s: float | None = None) -> T | None:
        """The oldest batch, waiting for one; None when closed and empty, or on timeout."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self._cond:
            while not self._items and not self._closed:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return None
                self._cond.wait(left)
            return self._items.popleft() if self._items else None

    def task_done(self, item: T) -> None:
        """A batch from `get` is handled: its rows no longer count against the capacity."""
        with self._cond:
            self._rows -= len(item)
            self._cond.notify_all()

    def drain(self) -> list[T]:
        """Everything queued, oldest first; the queue is empty afterwards."""
        with self._cond:
            out = list(self._items)
            self._items.clear()
            self._rows -= sum(len(b) for b in out)
            self._cond.notify_all()
        return out

    def join(self, timeout_s: float) -> bool:
        """Wait until every queued batch is handled; False when `timeout_s` passed first."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while self._rows:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
        return True

    def close(self, *, drop_pending: bool = False) -> None:
        """Refuse further batches and wake waiting consumers; with `drop_pending`, what is
        still queued is discarded and counted as dropped."""
        with self._cond:
            self._closed = True
            if drop_pending:
                lost = sum(len(b) for b in self._items)
                self.dropped += lost
                self._rows -= lost
                self._items.clear()
            self._cond.notify_all()

    @property
    def pending(self) -> int:
        """Rows queued or taken and not done yet."""
        return self._rows

    @property
    def closed(self) -> bool:
        return self._closed


__all__ = ["BoundedQueue"]
