"""The chiptrace spans around a profiling window: what imported profiler events nest under.

Two sources, both of this process: the spans that finish while the profiler runs, caught
by a sink on the recorder (they reach it as Arrow batches on the writer thread, so the
program pays nothing per span), and the spans still open when the window starts or a trace
is ready, read from the context of the thread that runs the profiler (an `epoch` span
around the loop has not ended yet when its steps are imported).
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import pyarrow as pa

from chiptrace.api import current_span
from chiptrace.importers.within import OPEN_NS, Within
from chiptrace.recorder import Recorder


def _column(batch: pa.RecordBatch, name: str, width: int) -> np.ndarray:
    """A fixed-size binary column as an (n, width) uint8 matrix, without copying."""
    arr = batch.column(name)
    data = np.frombuffer(arr.buffers()[1], np.uint8)
    return data[arr.offset * width : (arr.offset + len(arr)) * width].reshape(-1, width)


def _ints(batch: pa.RecordBatch, name: str) -> np.ndarray:
    arr = batch.column(name)
    return np.frombuffer(arr.buffers()[1], np.int64)[arr.offset : arr.offset + len(arr)]


_Ids = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]  # trace, span, start, end


def _batch_ids(batch: pa.RecordBatch) -> _Ids:
    return (
        _column(batch, "trace_id", 16).copy(),
        _column(batch, "span_id", 8).copy().view(">u8").reshape(-1).astype(np.uint64),
        _ints(batch, "start_ns").copy(),
        _ints(batch, "end_ns").copy(),
    )


def _row_ids(rows: list[Any]) -> _Ids:
    """Ids and times of buffered span rows (chiptrace.recording.fastrows: trace high and low
    halves, span id, parent, start and end at 1..6 in every row shape)."""
    n = len(rows)
    trace = np.empty((n, 16), np.uint8)
    trace[:, :8] = np.fromiter((r[1] for r in rows), ">u8", n).view(np.uint8).reshape(n, 8)
    trace[:, 8:] = np.fromiter((r[2] for r in rows), ">u8", n).view(np.uint8).reshape(n, 8)
    span = np.fromiter((r[3] for r in rows), np.uint64, n)
    start = np.fromiter((r[5] for r in rows), np.int64, n)
    end = np.fromiter((r[6] for r in rows), np.int64, n)
    return trace, span, start, end


def _concat(parts: list[_Ids]) -> _Ids:
    if not parts:
        empty = np.zeros(0, np.int64)
        return np.zeros((0, 16), np.uint8), empty.astype(np.uint64), empty, empty
    trace, span, start, end = (np.concatenate(c) for c in zip(*parts, strict=True))
    return trace, span, start, end


class _Capture:
    """A recorder sink that keeps the ids and times of the spans it is handed."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.parts: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = []

    def write(self, batch: pa.RecordBatch) -> None:
        if not batch.num_rows:
            return
        part = _batch_ids(batch)
        with self.lock:
            self.parts.append(part)

    def close(self) -> None:
        pass

    def take(self, since_ns: int) -> _Ids:
        """The spans that end at or after `since_ns`; earlier ones are forgotten."""
        with self.lock:
            parts, self.parts = self.parts, []
        trace, span, start, end = _concat(parts)
        keep = end >= since_ns
        kept = (trace[keep], span[keep], start[keep], end[keep])
        with self.lock:
            self.parts.insert(0, kept)
        return kept


def _open_span() -> tuple[bytes, int, int] | None:
    """(trace id, span id, start ns) of the current span, chiptrace's or any OTel SDK's."""
    span: Any = current_span()
    ctx = span.get_span_context()
    if not ctx.is_valid:
        return None
    start = getattr(span, "start_ns", None) or getattr(span, "start_time", None)
    if not isinstance(start, int):
        return None
    return ctx.trace_id.to_bytes(16, "big"), ctx.span_id, start


class RunSpans:
    """This process's spans around a profiling window (see the module docstring)."""

    def __init__(self, recorder: Recorder) -> None:
        self.recorder = recorder
        self._capture = _Capture()
        self._open: dict[int, tuple[bytes, int]] = {}
        self._lock = threading.Lock()
        self._jobs = 0  # snapshots asked for and not yet taken
        self._closed = False
        # The sinks list is rebound, never changed in place: the writer thread may be
        # iterating the old one.
        recorder.sinks = [*recorder.sinks, self._capture]

    def note_open(self) -> None:
        """Remember the span open on this thread now."""
        found = _open_span()
        if found is not None:
            trace_id, span_id, start = found
            self._open.setdefault(span_id, (trace_id, start))

    def expect(self) -> None:
        """A snapshot will be asked for: the capture stays on until it is taken."""
        with self._lock:
            self._jobs += 1

    def within(self, since_ns: int) -> Within:
        """The run spans for an import of events from `since_ns` on: those the recorder
        handed over, and those still in its buffer (read in place: a flush per profiler
        cycle, a Parquet part and a manifest each, cost the program more than the profiler
        itself); ends an `expect()`."""
        try:
            rows, batches = self.recorder.peek()
            pending = [_batch_ids(b) for b in batches if b.num_rows]
            if rows:
                pending.append(_row_ids(rows))
            return self._snapshot(since_ns, _concat(pending))
        finally:
            with self._lock:
                self._jobs -= 1
                last = self._closed and not self._jobs
            if last:
                self._detach()

    def _snapshot(self, since_ns: int, pending: _Ids) -> Within:
        taken = self._capture.take(since_ns)
        keep = pending[3] >= since_ns
        kept = (pending[0][keep], pending[1][keep], pending[2][keep], pending[3][keep])
        # A buffered span may reach the capture before the next snapshot: once per id.
        trace, span, start, end = _concat([taken, kept])
        span, first = np.unique(span, return_index=True)
        trace, start, end = trace[first], start[first], end[first]
        done = set(span.tolist())
        still = [(k, v) for k, v in self._open.items() if k not in done]
        if still:
            trace = np.concatenate(
                [trace, np.frombuffer(b"".join(t for _, (t, _) in still), np.uint8).reshape(-1, 16)]
            )
            span = np.concatenate([span, np.array([k for k, _ in still], np.uint64)])
            start = np.concatenate([start, np.array([s for _, (_, s) in still], np.int64)])
            end = np.concatenate([end, np.full(len(still), OPEN_NS, np.int64)])
        cfg = self.recorder.config
        return Within(
            trace_id=trace,
            span_id=span,
            start=start,
            end=end,
            service=cfg.service,
            host=cfg.host,
            resource={"service.name": cfg.service, **cfg.resource},
            run_id=cfg.run_id,
            manifest={"source": "torch.profiler"},
        )

    def close(self) -> None:
        """No more snapshots will be expected; the capture ends after the last one."""
        with self._lock:
            self._closed = True
            last = not self._jobs
        if last:
            self._detach()

    def _detach(self) -> None:
        rec = self.recorder
        rec.sinks = [s for s in rec.sinks if s is not self._capture]
