"""Spans acknowledged and not yet written: a bounded buffer and the one thread that writes it.

The collector acknowledges a request once `Spool.offer` has taken its spans, so the spool
keeps a promise the in-process recorder does not make: what it took, it writes. A part
that fails to write (a full disk, a partition folder that cannot be written) goes back to
the front of the queue and is retried with backoff; until it is written, `offer` refuses
new spans. It also refuses spans it could not keep its promise for: past its bound in
spans or bytes (after a short wait for the writer), or when writing them could leave the
disk with less than `min_free_bytes` (buffered spans count at their Arrow size, which is
larger than their Parquet). A refusal is `StoreUnavailable`, which the receiver answers
with 503 / UNAVAILABLE and a Retry-After, so OTLP clients keep the spans and retry.
"""

from __future__ import annotations

import collections
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import pyarrow as pa

from chiptrace.collector.wal import PartTag, WriteAheadLog, encode
from chiptrace.errors import ChiptraceError

log = logging.getLogger("chiptrace")

_MIB = 1 << 20
_BACKOFF_S = (0.5, 1.0, 2.0, 5.0, 10.0)
_CLOSE_ATTEMPTS = 3  # at shutdown, tries of a failing part before it is reported unwritten


class StoreUnavailable(ChiptraceError):
    """The spool cannot take spans now; the client should retry after `retry_after_s`."""

    def __init__(self, reason: str, retry_after_s: int = 1) -> None:
        super().__init__(reason)
        self.retry_after_s = retry_after_s


class PartialWrite(Exception):
    """A sink wrote some of a table: `unwritten` holds the rows it could not write."""

    def __init__(self, unwritten: pa.Table, error: BaseException) -> None:
        super().__init__(str(error))
        self.unwritten = unwritten
        self.error = error


class PartSink(Protocol):
    """Where the spool writes: all of a table, or raise (PartialWrite for some of it).
    `tag` names the log records the table holds (None: the spool has no log)."""

    def write(self, table: pa.Table, tag: PartTag | None = None) -> None: ...


@dataclass
class _Entry:
    """Queued spans: log records `first`..`last` (0, 0 without a log). `alone`: the rows a
    part failed to write, retried as that part again (same name, same rows) so the part
    names keep telling which records are stored."""

    batch: pa.RecordBatch | pa.Table
    size: int
    first: int
    last: int
    alone: bool = False


@dataclass(frozen=True)
class SpoolLimits:
    """When the spool writes a part, and how much it holds.

    A part is written when `flush_spans` or `flush_bytes` are buffered (or half the
    bounds, when those are smaller), when `flush_interval_s` has passed, or at once when a
    request waits for room; a part holds at most `flush_spans` and about `flush_bytes`.
    """

    flush_interval_s: float = 2.0
    flush_spans: int = 200_000
    flush_bytes: int = 64 * _MIB
    max_spans: int = 2_000_000
    max_bytes: int = 256 * _MIB
    min_free_bytes: int = 64 * _MIB
    wait_s: float = 2.0
    rotate_log: bool = False  # close the log's segment at each part (see compact.py)


class Spool:
    """A bounded queue of span batches and the thread writing them to `sink` in parts.

    Args:
        sink: where parts go.
        limits: sizes and intervals.
        disk: a path on the filesystem the sink writes to, for the free-space check
            (None: no check).
        wal: the write-ahead log `offer` appends and syncs each batch to before it returns
            (None: acknowledged spans live in memory until written).
        on_written: called from the writing thread with the last log record parts now
            hold (every earlier one is held too).
    """

    def __init__(
        self,
        sink: PartSink,
        limits: SpoolLimits,
        disk: Path | None = None,
        wal: WriteAheadLog | None = None,
        on_written: Callable[[int], None] | None = None,
    ) -> None:
        self.sink = sink
        self.limits = limits
        self.disk = disk
        self.wal = wal
        self.on_written = on_written
        self.written_through = 0
        self.stored = 0
        self.unwritten = 0
        self.last_error = ""
        self._queue: collections.deque[_Entry] = collections.deque()
        self._spans = self._bytes = 0  # queued and being written
        self._waiters = 0
        self._failing = ""
        self._failures = self._close_failures = 0
        self._retry_at = 0.0
        self._closing = False
        self._last_flush = time.monotonic()
        self._cond = threading.Condition()
        self._flush_at_spans = max(1, min(limits.flush_spans, limits.max_spans // 2))
        self._flush_at_bytes = max(1, min(limits.flush_bytes, limits.max_bytes // 2))
        self._thread = threading.Thread(target=self._run, name="chiptrace-spool", daemon=True)
        self._thread.start()

    @property
    def closing(self) -> bool:
        """close() was called: no more work than writing what was taken."""
        return self._closing

    @property
    def pressed(self) -> bool:
        """Closing, or a request waits for room: the writer has better things to do."""
        return self._closing or self._waiters > 0

    @property
    def pending(self) -> int:
        """Spans taken and not written yet."""
        return self._spans

    @property
    def pending_bytes(self) -> int:
        return self._bytes

    # ------------------------------------------------------------ taking spans

    def offer(self, batch: pa.RecordBatch) -> None:
        """Take a batch, to be written; returns once it is the spool's to write (with a
        log: once it is in the log on disk, so a SIGKILL does not lose it).

        Raises:
            StoreUnavailable: closing, the store failing, the disk nearly full, the log
                not writable, or no room within `limits.wait_s`; nothing of the batch was
                taken (but for a failed log sync, after which it may still be stored).
        """
        n, size = batch.num_rows, batch.get_total_buffer_size()
        if not n:
            return
        payload = encode(batch) if self.wal is not None else memoryview(b"")
        seq = self._enqueue(batch, n, size, payload)
        if self.wal is not None:
            try:
                self.wal.sync(seq)
            except OSError as e:
                raise StoreUnavailable(
                    f"cannot sync the write-ahead log: {e.strerror or e}", retry_after_s=5
                ) from None

    def _enqueue(self, batch: pa.RecordBatch, n: int, size: int, payload: memoryview) -> int:
        lim = self.limits
        with self._cond:
            self._refuse_if_unable(size)
            deadline = time.monotonic() + lim.wait_s
            while self._spans and (
                self._spans + n > lim.max_spans or self._bytes + size > lim.max_bytes
            ):
                left = deadline - time.monotonic()
                if left <= 0:
                    raise StoreUnavailable(
                        f"the store is behind: {self._spans:,} spans "
                        f"({self._bytes / _MIB:.0f} MiB) waiting to be written",
                        retry_after_s=1,
                    )
                self._waiters += 1
                self._cond.notify_all()  # the writer flushes at once for a waiting request
                self._cond.wait(left)
                self._waiters -= 1
                self._refuse_if_unable(size)
            seq = 0
            if self.wal is not None:  # under the lock: the queue's order is the log's
                try:
                    seq = self.wal.append(payload)
                except OSError as e:
                    raise StoreUnavailable(
                        f"cannot write the write-ahead log: {e.strerror or e}", retry_after_s=10
                    ) from None
            self._queue.append(_Entry(batch, size, seq, seq))
            self._spans += n
            self._bytes += size
            if self._spans >= self._flush_at_spans or self._bytes >= self._flush_at_bytes:
                self._cond.notify_all()
            return seq

    def _refuse_if_unable(self, size: int) -> None:
        if self._closing:
            raise StoreUnavailable("the collector is shutting down", retry_after_s=5)
        if self._failing:
            raise StoreUnavailable(
                f"cannot write to the store: {self._failing}", retry_after_s=self._retry_after()
            )
        if self.disk is None:
            return
        try:
            st = os.statvfs(self.disk)
        except OSError:
            return  # the write will tell
        free = st.f_bavail * st.f_frsize
        # With a log, the batch goes to disk twice: its log record now, its part later.
        need = self._bytes + size * (2 if self.wal is not None else 1)
        if free < need + self.limits.min_free_bytes:
            raise StoreUnavailable(
                f"the disk holding {self.disk} is nearly full: {free / _MIB:.0f} MiB free, "
                f"{self._bytes / _MIB:.0f} MiB buffered to write, "
                f"{self.limits.min_free_bytes / _MIB:.0f} MiB kept free",
                retry_after_s=10,
            )

    def _retry_after(self) -> int:
        return max(1, round(self._retry_at - time.monotonic()))

    # ------------------------------------------------------------ writing

    def _run(self) -> None:
        while True:
            with self._cond:
                part = self._next_part()
            if part is None:
                return
            self._write(part)

    def _next_part(self) -> list[_Entry] | None:
        """The batches of the next part, waiting until one is due; None: stop."""
        lim = self.limits
        while True:
            now = time.monotonic()
            if self._queue and self._failing:
                if self._closing and self._close_failures >= _CLOSE_ATTEMPTS:
                    return None
                if now < self._retry_at:
                    self._cond.wait(self._retry_at - now)
                    continue
                return self._take()
            if self._queue and (
                self._closing
                or self._waiters
                or self._spans >= self._flush_at_spans
                or self._bytes >= self._flush_at_bytes
                or now - self._last_flush >= lim.flush_interval_s
            ):
                return self._take()
            if self._closing:
                return None
            self._cond.wait(max(0.01, lim.flush_interval_s - (now - self._last_flush)))

    def _take(self) -> list[_Entry]:
        lim = self.limits
        if lim.rotate_log and self.wal is not None and not self._closing:
            # Under the lock, so the segment ends at the queue's last record: once this
            # part is written, the segment goes, and its parts may be merged.
            try:
                self.wal.rotate()
            except OSError as err:  # its records' syncs fail (503); the segment stays
                log.warning("chiptrace: could not close a write-ahead log segment: %s", err)
        part = [self._queue.popleft()]
        if part[0].alone:
            return part
        spans, size = part[0].batch.num_rows, part[0].size
        while self._queue:
            e = self._queue[0]
            if (
                e.alone
                or spans + e.batch.num_rows > lim.flush_spans
                or size + e.size > lim.flush_bytes
            ):
                break
            part.append(self._queue.popleft())
            spans += e.batch.num_rows
            size += e.size
        return part

    def _write(self, part: list[_Entry]) -> None:
        # One dictionary per column across the part's batches (each request brought its own).
        table = pa.concat_tables(
            [
                e.batch if isinstance(e.batch, pa.Table) else pa.Table.from_batches([e.batch])
                for e in part
            ]
        ).combine_chunks()
        first, last = part[0].first, part[-1].last
        tag = PartTag(self.wal.writer, first, last) if self.wal is not None else None
        unwritten: pa.Table | None = None
        try:
            self.sink.write(table, tag)
        except PartialWrite as e:
            unwritten, error = e.unwritten, e.error
        except Exception as e:  # noqa: BLE001 - kept and retried; the server goes on
            unwritten, error = table, e
        with self._cond:
            self._spans -= table.num_rows
            self._bytes -= sum(e.size for e in part)
            self._last_flush = time.monotonic()
            if unwritten is not None and unwritten.num_rows:
                self._keep(
                    _Entry(unwritten, unwritten.get_total_buffer_size(), first, last, True), error
                )
            else:
                self.written_through = max(self.written_through, last)
                if self._failing:
                    log.warning("chiptrace: the store is writable again; accepting spans")
                    self._failing, self._failures = "", 0
            self.stored += table.num_rows - (unwritten.num_rows if unwritten is not None else 0)
            self._cond.notify_all()
        if self.on_written is not None and (unwritten is None or not unwritten.num_rows):
            self.on_written(last)

    def _keep(self, entry: _Entry, error: BaseException) -> None:
        """Put what did not write back at the front, and refuse spans until it does."""
        unwritten = entry.batch
        self._queue.appendleft(entry)
        self._spans += unwritten.num_rows
        self._bytes += entry.size
        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
        if not self._failing:
            log.warning(
                "chiptrace: could not write %d spans (kept, retrying; refusing new spans "
                "with 503 meanwhile): %s",
                unwritten.num_rows,
                reason,
            )
        self._failing, self.last_error = reason, reason
        delay = _BACKOFF_S[min(self._failures, len(_BACKOFF_S) - 1)]
        self._failures += 1
        self._close_failures += int(self._closing)
        self._retry_at = time.monotonic() + (0.2 if self._closing else delay)

    # ------------------------------------------------------------ closing

    def close(self) -> None:
        """Write everything taken, then stop. A part that keeps failing is retried a few
        times; what is still unwritten then is counted in `unwritten` (and `last_error`
        says why). Idempotent."""
        with self._cond:
            self._closing = True
            self._retry_at = min(self._retry_at, time.monotonic())  # a last try now
            self._cond.notify_all()
        self._thread.join()
        with self._cond:
            self.unwritten = self._spans
            if self.unwritten:
                log.error(
                    "chiptrace: %d acknowledged spans could not be written: %s",
                    self.unwritten,
                    self.last_error,
                )
