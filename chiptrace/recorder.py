"""The recorder: bounded in-memory span buffers, a writer thread, and the sinks it feeds.

Two ways in: a row per traced call, appended to the current 1,024-row chunk (a list
append; see `roll`), and `write_batch(batch)` for whole columns (the emulator, the
collector). A daemon thread
flushes by size and by interval, and at exit, to every sink: the Parquet store, any
OpenTelemetry SpanExporter, a live feed. The traced program never waits on a sink and
never sees a sink's exception: a full buffer drops and counts, a failing sink is logged.

Importing this module loads no Arrow: NumPy and pyarrow load where the writer first
converts (`_convert`, `flush`), or in `__init__` for a recorder given its sinks. The
zero-configuration start (`setup=`) builds its store on the writer thread at the first
flush, so nothing of chiptrace's start-up lands inside the program's first span.

Deadlines: `flush()` waits for another flush at most the shutdown timeout and returns at
once when it interrupted its own thread's flush (a signal handler); `shutdown()` has the
writer thread do the last flush and waits at most its timeout, then counts what is left
as dropped in the manifest.
"""

from __future__ import annotations

import collections

# pa.array() imports pandas, when installed, the first time it runs; when that is the exit
# flush, pandas' own import of concurrent.futures.thread failed ("can't register atexit
# after shutdown") and the last spans were dropped. Loaded here, it is there already.
import concurrent.futures.thread  # noqa: F401
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from chiptrace.config import Config
from chiptrace.errors import ChipError
from chiptrace.recording import exit_hooks as _exit
from chiptrace.recording.exit_hooks import cancel_exit, on_exit
from chiptrace.recording.writer import SpanSink, StoreSink, convert, emit, row_bytes, warm_up, why
from chiptrace.vocab import dumps

if TYPE_CHECKING:
    import pyarrow as pa

    from chiptrace.store import PartWriter

log = logging.getLogger("chiptrace")
__all__ = ["Recorder", "SpanSink", "StoreSink", "describe", "on_exit", "cancel_exit"]

_POLL_S = 0.05
CHUNK = 1024  # rows per buffer chunk
PEEK_WAIT_S = 10.0  # see Recorder.peek
# At shutdown the sinks on their own threads get the deadline less this, so that what they
# could not deliver is in the manifest before shutdown() stops waiting.
_MANIFEST_S = 0.2


class Recorder:
    """Buffers spans and hands them to sinks from one writer thread.

    Args:
        config: resolved settings (flush interval and size, buffer bounds, identity).
        sinks: destinations; the store is usually the first.
        writer: the PartWriter whose manifest records drop counts (optional).
        setup: builds (sinks, writer) on the writer thread at the first flush, instead of
            `sinks` and `writer` now (the zero-configuration start: see the module doc).
    """

    def __init__(
        self,
        config: Config,
        sinks: Iterable[SpanSink] = (),
        writer: PartWriter | None = None,
        *,
        setup: Callable[[], tuple[list[SpanSink], PartWriter | None]] | None = None,
    ) -> None:
        self.config = config
        self.sinks: list[SpanSink] = list(sinks)
        self.writer = writer
        self._setup = setup
        # The buffer: the traced threads append rows to `cur`; every CHUNK rows `roll`
        # turns it into a tuple. Rows are tuples of ints and strings, so once a collection
        # has seen them the garbage collector untracks them, and then the chunk tuples:
        # a million buffered spans cost the collector nothing.
        self.max_buffered = config.max_buffered
        self.max_bytes = config.max_buffered_bytes
        self.chunk_rows = min(CHUNK, self.max_buffered)
        self.cur: list[Any] = []
        self._full: collections.deque[tuple[Any, ...]] = collections.deque()
        self._full_rows = 0
        self._full_bytes = 0
        self._roll_lock = threading.Lock()
        self.dropped = 0
        self._sink_errors = 0
        self.spans_flushed = 0
        self.spans_rejected = 0  # of `dropped`: spans with a value that fits no column
        self._dropped_recorded = 0
        self._failing: set[int] = set()  # sinks whose last write failed (warned once)
        self._failing_names: set[str] = set()
        self.store_error: str | None = None  # the first failure of the first sink (the store)
        self._batches: collections.deque[pa.RecordBatch] = collections.deque()
        self._batch_rows = 0
        self._batch_bytes = 0
        self._drop_lock = threading.Lock()
        self._manifest_lock = threading.Lock()
        self._flush_lock = threading.Lock()
        self._flush_owner: int | None = None  # the thread flushing now
        self._space = threading.Condition()
        self._wake = threading.Event()
        self._done = threading.Event()  # the writer thread has closed the sinks
        self._stop = False
        self.gave_up = False  # shutdown() ran out of time (see _give_up)
        self._close_by: float | None = None  # monotonic deadline of the last close
        self._in_flight = 0  # spans a flush took and has not handed to the sinks yet
        self._counted_lost = 0  # of `dropped`: spans a give-up counted that may yet be written
        self._last_flush = time.monotonic()
        # Called before each flush and at each wake of the writer thread (final=True once,
        # at shutdown): they hand in spans they held back, e.g. GPU-timed spans whose CUDA
        # events have completed (chiptrace.recording.device). Rebound, never changed in place.
        self.resolvers: list[Callable[[bool], None]] = []
        resource = {"service.name": config.service, **config.resource}
        self.constants: dict[str, Any] = {
            "service": config.service,
            "host": config.host,
            "pid": os.getpid(),
            "scope": "chiptrace",
            "resource": dumps(resource),
        }
        if setup is None:
            warm_up(self.constants)
        self._thread = threading.Thread(target=self._run, name="chiptrace-writer", daemon=True)
        self._thread.start()

    def _set_up(self) -> None:
        """Build the deferred sinks (under the flush lock, before the first flush)."""
        setup, self._setup = self._setup, None
        if setup is None:
            return
        try:
            sinks, writer = setup()
        except Exception as e:  # noqa: BLE001 - tracing must never crash the program
            log.warning("chiptrace: tracing stopped: %s", e)
            self.store_error = why(e)
            return
        self.sinks, self.writer = [*sinks, *self.sinks], writer
        warm_up(self.constants)

    # ------------------------------------------------------------ ingest

    def drop(self, n: int = 1) -> None:
        """Count spans lost to a full buffer or a failed write."""
        with self._drop_lock:
            self.dropped += n

    def record(self, row: Any) -> None:
        """Buffer one span row (see chiptrace.recording.fastrows); a full buffer drops and counts."""
        cur = self.cur
        cur.append(row)
        if len(cur) >= self.chunk_rows:
            self.roll()

    def roll(self) -> None:
        """Set the current chunk aside as a tuple; called by the traced thread that filled
        it (once per CHUNK spans). Rows beyond max_buffered are dropped and counted here,
        so the hot path never checks the bound itself."""
        with self._roll_lock:
            cur = self.cur
            if len(cur) < self.chunk_rows:
                return  # another thread rolled it first
            self.cur = []
            self._keep(cur)
        if self._full_rows >= self.config.flush_spans:
            self._wake.set()

    def _keep(self, rows: list[Any]) -> None:
        room = self.max_buffered - self._full_rows
        if room < len(rows):
            self.drop(len(rows) - max(room, 0))
            rows = rows[: max(room, 0)]
        if not rows:
            return
        size = row_bytes(rows)
        if self._full_bytes + size > self.max_bytes:  # keep what fits, at the chunk's mean
            fits = max(self.max_bytes - self._full_bytes, 0) * len(rows) // size
            self.drop(len(rows) - fits)
            self._wake.set()
            rows, size = rows[:fits], size * fits // len(rows)
            if not rows:
                return
        self._full.append(tuple(rows))
        self._full_rows += len(rows)
        self._full_bytes += size

    def chunks(self) -> list[tuple[Any, ...]]:
        """The full chunks buffered now (for tests and diagnostics)."""
        return list(self._full)

    def peek(self) -> tuple[list[Any], list[pa.RecordBatch]]:
        """The rows and batches buffered now, left in place: a reader that needs every span
        ended so far (chiptrace.torch) gets them without forcing a flush, which writes a
        part and its manifest. Waits for a flush in progress, whose spans reach the sinks;
        a flush stuck past PEEK_WAIT_S (a full disk's fsync) costs the reader those spans,
        never a hang."""
        if not self._flush_lock.acquire(timeout=PEEK_WAIT_S):
            log.warning("chiptrace: a flush took over %.0f s; spans read without it", PEEK_WAIT_S)
            return [], []
        try:
            with self._roll_lock:
                rows = [row for chunk in self._full for row in chunk]
                rows.extend(self.cur)
            with self._space:
                batches = list(self._batches)
        finally:
            self._flush_lock.release()
        return rows, batches

    def write_batch(self, batch: pa.RecordBatch, block: bool = False) -> bool:
        """Buffer whole columns. Returns False when the batch was dropped.

        Args:
            batch: a RecordBatch of the span schema (see `schema.batch_from_columns`).
            block: wait for room instead of dropping (for producers that can be slowed,
                like the emulator; a traced program must never block).
        """
        from chiptrace.schema import SPAN_SCHEMA

        if not batch.schema.equals(SPAN_SCHEMA, check_metadata=False):
            raise ChipError("write_batch expects the span schema; build it with batch_from_columns")
        size = batch.nbytes
        with self._space:
            while self._batch_rows and (
                self._batch_rows + batch.num_rows > self.max_buffered
                or self._batch_bytes + size > self.max_bytes
            ):
                if not block or self._stop:
                    self.drop(batch.num_rows)
                    return False
                self._wake.set()
                self._space.wait(0.5)
            self._batches.append(batch)
            self._batch_rows += batch.num_rows
            self._batch_bytes += size
        if self._batch_rows >= self.config.flush_spans:
            self._wake.set()
        return True

    @property
    def sink_errors(self) -> int:
        """Failed sink writes: the writer's own, and those of sinks on their own threads."""
        return self._sink_errors + sum(getattr(s, "errors", 0) for s in self.sinks)

    @property
    def pending(self) -> int:
        return len(self.cur) + self._full_rows + self._batch_rows

    # ------------------------------------------------------------ flush

    def _take(self) -> list[pa.RecordBatch]:
        with self._roll_lock:
            cur, self.cur = self.cur, []
            self._keep(cur)
            chunks = list(self._full)
            self._in_flight = self._full_rows + self._batch_rows  # until emitted
            self._full.clear()
            self._full_rows = 0
            self._full_bytes = 0
        out = self._convert(chunks) if chunks else []
        with self._space:
            while self._batches:
                out.append(self._batches.popleft())
            self._batch_rows = 0
            self._batch_bytes = 0
            self._space.notify_all()
        return out

    def _convert(self, chunks: list[tuple[Any, ...]]) -> list[pa.RecordBatch]:
        yielding = threading.current_thread() is self._thread
        out, failed, bad = convert(chunks, self.constants, yielding)
        if failed:
            self.drop(failed)
        if bad:
            self._reject(bad)
        return out

    def _reject(self, rejected: Mapping[int, str]) -> None:
        """Count spans left out for a bad value; one warning line per flush says why."""
        self.drop(len(rejected))
        self.spans_rejected += len(rejected)
        first = next(iter(rejected.values()))
        more = f" (and {len(rejected) - 1} more)" if len(rejected) > 1 else ""
        log.warning("chiptrace: dropped a span with a bad value: %s%s", first, more)

    def flush(self, timeout_s: float | None = None) -> int:
        """Hand everything buffered to the sinks now; returns the spans flushed.

        Safe from any thread and from a signal handler: a call that interrupted its own
        thread's flush returns 0 at once (that flush writes these spans), and a flush in
        progress elsewhere is waited for at most `timeout_s` (default: the shutdown
        timeout), after which this call returns 0.
        """
        me = threading.get_ident()
        if self._flush_owner == me:
            return 0
        wait = self.config.shutdown_timeout_s if timeout_s is None else timeout_s
        if not self._flush_lock.acquire(timeout=max(wait, 0.0)):
            return 0
        self._flush_owner = me
        _exit._flushing.add(me)
        try:
            total = self._flush_locked()
        except BaseException:
            # The program's signal handler raised into this flush (KeyboardInterrupt, or
            # sys.exit() from its own SIGTERM handler): the spans it had taken never reach
            # the store now. Counted, so the manifest the exit flush writes says so.
            self._settle(0, self._in_flight)
            raise
        finally:
            self._flush_owner = None
            self._flush_lock.release()
            _exit._flushing.discard(me)
            _exit.after_flush()  # a SIGTERM during this flush ends the process now
        if threading.current_thread() is not self._thread:
            self._wait_sinks(wait)  # an explicit flush: the queued sinks have it too
        return total

    def _wait_sinks(self, timeout_s: float) -> None:
        """Wait for the sinks on their own threads (at once past a hung one)."""
        deadline = time.monotonic() + timeout_s
        for sink in self.sinks:
            wait = getattr(sink, "wait", None)
            if wait is not None:
                wait(max(deadline - time.monotonic(), 0.0))

    def _flush_locked(self) -> int:
        self._last_flush = time.monotonic()
        if self._setup is not None:
            self._set_up()
        self._resolve(False)
        batches = self._take()
        total = sum(b.num_rows for b in batches)
        if total:
            import pyarrow as pa

            from chiptrace.schema import SPAN_SCHEMA

            # The batches as chunks, not combined: the Parquet writer encodes them into one
            # row group as it would the combined table (the same file), and combining them
            # (dictionaries unified per chunk) cost ~0.3 us a span of the writer's CPU.
            table = pa.Table.from_batches(batches, SPAN_SCHEMA)
            emit(self, table)
            self.spans_flushed += total
        self._settle(total, 0)
        if self.writer is not None and (total or self.dropped != self._dropped_recorded):
            self._update_manifest()
        return total

    def _settle(self, written: int, lost: int) -> None:
        """The flush in flight is over: `written` of its spans reached the sinks, `lost`
        did not. A give-up (shutdown() past its deadline) counted them all as dropped
        already; a flush that finishes after it takes its written spans back off that
        count, so the manifest never says a span was both written and dropped."""
        with self._drop_lock:
            self._in_flight = 0
            back = min(written, self._counted_lost)
            counted = min(lost, self._counted_lost - back)
            self._counted_lost -= back + counted
            self.dropped += lost - counted - back

    def _update_manifest(self) -> None:
        if self.writer is None:
            return
        # The counts are read under the lock the write holds: two writers (a flush, and a
        # give-up's own thread) then cannot leave the older numbers last in the file.
        with self._manifest_lock:
            dropped = self.dropped
            counts = {
                "spans_dropped": dropped,
                "spans_rejected": self.spans_rejected,
                "sink_errors": self.sink_errors,
            }
            # Spans a sink other than the store never delivered: dropped (queue full,
            # hung, left at exit) or failed (the exporter raised or refused them).
            sink_dropped = sum(
                getattr(s, "dropped", 0) + getattr(s, "failed", 0) for s in self.sinks[1:]
            )
            if sink_dropped:
                counts["sink_spans_dropped"] = sink_dropped
            try:
                self.writer.write_manifest(**counts)
                self._dropped_recorded = dropped
            except OSError as e:
                if "manifest" not in self._failing_names:
                    self._failing_names.add("manifest")
                    log.warning("chiptrace: could not update manifest: %s", e)

    def _run(self) -> None:
        interval = self.config.flush_interval_s
        while not self._stop:
            self._wake.wait(_POLL_S)
            self._wake.clear()
            self._resolve(False)
            due = time.monotonic() - self._last_flush >= interval
            if self.pending >= self.config.flush_spans or (due and self.pending):
                self.flush()
        self._finish()

    def _finish(self) -> None:
        """The last flush and the sinks' close (on the writer thread, at shutdown)."""
        try:
            self._resolve(True)
            self.flush()
            deadline = self._close_by or time.monotonic() + self.config.shutdown_timeout_s
            deadline -= _MANIFEST_S  # the sinks' drops reach the manifest before it
            for sink in self.sinks:
                try:
                    close = sink.close
                    if getattr(sink, "queued", False):  # its own thread: within what is left
                        close(max(deadline - time.monotonic(), 0.0))  # type: ignore[call-arg]
                    else:
                        close()
                except Exception as e:  # noqa: BLE001
                    log.warning("chiptrace: closing %s failed: %s", type(sink).__name__, e)
            if len(self.sinks) > 1:
                self._update_manifest()  # what the other sinks could not deliver by now
        finally:
            self._done.set()

    def _resolve(self, final: bool) -> None:
        for resolve in self.resolvers:
            try:
                resolve(final)
            except Exception as e:  # noqa: BLE001 - a resolver never stops the writer
                if "resolver" not in self._failing_names:
                    self._failing_names.add("resolver")
                    log.warning("chiptrace: span resolver %r failed: %s", resolve, e)

    def abandon(self) -> None:
        """Forget buffered spans and sinks without writing (a forked child's inherited copy)."""
        self._stop = True
        self._setup = None
        self.cur = []
        self._full = collections.deque()
        self._full_rows = 0
        self._batches.clear()
        self._batch_rows = 0
        self.sinks = []
        self.writer = None
        self._done.set()

    def shutdown(self, timeout_s: float | None = None) -> bool:
        """Flush what is buffered, stop the thread, close the sinks, within `timeout_s`
        (default: the shutdown timeout). Returns False when it ran out of time: what was
        not written then is counted as dropped in the manifest.

        Idempotent, and safe from two threads at once (an exit hook and the program's own
        shutdown()) and from a signal handler that interrupted a flush (it returns at
        once; the writer thread finishes when that flush has)."""
        wait = self.config.shutdown_timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + max(wait, 0.0)
        self._close_by = min(self._close_by or deadline, deadline)  # the sinks' close too
        self._stop = True
        self._wake.set()
        if self._flush_owner == threading.get_ident() or self._thread is threading.current_thread():
            return False  # it would wait on itself: the writer finishes when this returns
        if not self._thread.is_alive() and not self._done.is_set():
            self._finish()  # the writer thread is gone (it never started, or it failed)
        if self._done.wait(max(deadline - time.monotonic(), 0.0)):
            return True
        self._give_up(wait)
        return False

    def _give_up(self, waited: float) -> None:
        """Count what the deadline left unwritten and say so, on a thread of its own (a
        hung file system would hang the manifest write too)."""
        self.gave_up = True
        with self._drop_lock:
            lost = self.pending + self._in_flight  # buffered, and taken but not yet written
            self.dropped += lost
            self._counted_lost += lost
        log.warning(
            "chiptrace: exit did not finish writing within %.1f s; %d buffered spans dropped",
            waited,
            lost,
        )
        done = threading.Event()

        def record() -> None:
            self._update_manifest()
            done.set()

        threading.Thread(target=record, name="chiptrace-manifest", daemon=True).start()
        done.wait(0.3)


def describe(recorder: Recorder) -> Mapping[str, Any]:
    """Counters for a summary line or a test."""
    return {
        "flushed": recorder.spans_flushed,
        "pending": recorder.pending,
        "dropped": recorder.dropped,
        "sink_errors": recorder.sink_errors,
    }
