"""Where the viewer's spans come from: an in-process feed, a trace dir, or OTLP/HTTP.

Every source hands Arrow batches of the span schema to the app through one `SpanFeed`, a
bounded, thread-safe queue that is also a recorder `SpanSink`. The app's ingest worker
polls the sources and drains the feed into the live model, off the UI thread.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from chiptrace._queue import BoundedQueue
from chiptrace.errors import StoreError
from chiptrace.schema import SPAN_SCHEMA
from chiptrace.store import (
    part_files,
    part_problem,
    read_manifests,
    warn_skipped,
    writer_gone,
)
from chiptrace.viewer.live_model import INGEST_COLUMNS

log = logging.getLogger("chiptrace")


class SpanFeed:
    """A bounded queue of span batches; a `chiptrace.recorder.SpanSink`.

    `write` never blocks the producer (the recorder's writer thread, the emulator, an HTTP
    handler): past `max_spans` queued it drops the batch and counts it, as the recorder
    does, so a slow screen cannot stall a workload.
    """

    def __init__(self, max_spans: int = 2_000_000) -> None:
        self.max_spans = max_spans
        self.closed = False
        self._queue: BoundedQueue[pa.RecordBatch | pa.Table] = BoundedQueue(max_spans)

    def write(self, batch: pa.RecordBatch | pa.Table) -> None:
        """Queue a batch (thread-safe); drops and counts it when the queue is full."""
        self._queue.put(batch)

    def drain(self) -> list[pa.RecordBatch | pa.Table]:
        """Everything queued, oldest first."""
        return self._queue.drain()

    @property
    def received(self) -> int:
        """Spans queued since the start."""
        return self._queue.accepted

    @property
    def dropped(self) -> int:
        """Spans dropped because the queue was full."""
        return self._queue.dropped

    @property
    def pending(self) -> int:
        """Spans queued and not drained yet."""
        return self._queue.pending

    def close(self) -> None:
        # The recorder closes its sinks; other sources may still feed the app, so the
        # queue stays open.
        self.closed = True


class Source(Protocol):
    """A poller the ingest worker calls a few times a second."""

    name: str

    @property
    def store_dir(self) -> Path | None:
        """Where the source's spans are stored as parts (for SQL and the explorer), if any."""

    def poll(self, feed: SpanFeed) -> None:
        """Push whatever is new into `feed` (cheap when nothing changed)."""

    def manifests(self) -> list[dict[str, Any]]:
        """Run manifests known so far (topology, drop counts)."""

    def backlog(self) -> tuple[int | None, int]:
        """What the source holds and has not sent yet: (the latest end of those spans, or
        None when there are none; how many). The dashboard counts only time after that end
        as complete."""

    @property
    def ended(self) -> bool:
        """Whether the source has stopped for good (the viewer then says ENDED, not LIVE)."""

    def stop(self) -> object:
        """Stop for good; what it returns (a summary) is the caller's to use or not."""


def writers_ended(manifests: list[dict[str, Any]]) -> bool:
    """Whether every writer of a trace dir has finished: its manifest says so (it closed),
    or it ran on this host and its process is gone (a crash, a kill)."""
    if not manifests:
        return False
    return all(
        m.get("ended_unix_ns")
        or (isinstance(m.get("pid"), int) and writer_gone(str(m.get("host", "")), m["pid"]))
        for m in manifests
    )


@dataclass(frozen=True, slots=True)
class PartStats:
    """A part's row count and time range from its footer, without reading a span."""

    rows: int
    first_start_ns: int | None  # None: the footer has no statistics for it
    last_end_ns: int | None


def part_stats(path: Path) -> PartStats | None:
    """The footer's figures of one part, or None when the footer cannot be read (the part
    is reported when it is read)."""
    try:
        meta = pq.read_metadata(path)
    except (OSError, pa.ArrowException):
        return None
    names = meta.schema.names

    def bound(column: str, pick: Any) -> int | None:
        if column not in names:
            return None
        i = names.index(column)
        stats = [meta.row_group(g).column(i).statistics for g in range(meta.num_row_groups)]
        if not stats or any(st is None or not st.has_min_max for st in stats):
            return None
        values = [st.min if pick is min else st.max for st in stats]
        # Another type (a timestamp column): the part is skipped with a warning when read.
        return int(pick(values)) if all(type(v) is int for v in values) else None

    return PartStats(meta.num_rows, bound("start_ns", min), bound("end_ns", max))


def read_part(path: Path, columns: list[str] | None = None) -> pa.Table | None:
    """One part as a span table (only `columns`, default all), or None (with a warning)
    when it cannot be read."""
    schema = SPAN_SCHEMA if columns is None else pa.schema([SPAN_SCHEMA.field(c) for c in columns])
    try:
        reason = part_problem(path)
        if reason:
            warn_skipped(path, reason)
            return None
        part = pq.ParquetFile(path)
        names = set(part.schema_arrow.names)
        # decodes every page it reads: a corrupt one fails here. ParquetFile, not
        # pq.read_table: that loads pyarrow.dataset and with it pandas (~0.7 s a command).
        table = part.read(columns=[c for c in schema.names if c in names])
        from chiptrace.query import rows_problem  # DuckDB: loaded when a part is read

        reason = rows_problem(table)
        if reason:
            warn_skipped(path, reason)
            return None
        missing = [f for f in schema if f.name not in table.column_names]
        for f in missing:  # an older part without a newer nullable column
            table = table.append_column(f, pa.nulls(table.num_rows, f.type))
        # Another writer's widths and encodings (int32 pids, plain strings) as ours.
        return table.select(schema.names).cast(schema)
    except (OSError, pa.ArrowException) as e:
        warn_skipped(path, str(e).splitlines()[0] if str(e) else type(e).__name__)
        return None


class DirSource:
    """Follows a trace directory: each poll reads only the parts that appeared since.

    Parts are read newest first (by the last span end their footer records) and at most
    `POLL_SPANS` a poll, so a finished store of 100M spans shows its latest window after a
    few parts, while the older ones fill in the history behind it; `backlog()` says up to
    when the parts not read yet reach.

    Args:
        directory: the trace dir (it may not exist yet: a run about to start).
        replay: None to show parts as they land; a speed (1.0 = real time) to replay a
            finished trace's spans in the order they ended, paced to wall time.
    """

    #: Spans read per poll at most (about a part): between polls the dashboard redraws.
    POLL_SPANS = 500_000

    def __init__(self, directory: str | Path, replay: float | None = None) -> None:
        self.store_dir = Path(directory)
        self.name = str(directory)
        if self.store_dir.exists() and not self.store_dir.is_dir():
            raise StoreError(f"{directory}: expected a trace directory, not a file")
        self.replay = replay
        self._seen: set[Path] = set()
        self._stats: dict[Path, PartStats | None] = {}
        self._unread: list[Path] = []  # listed, not read yet: newest last
        self._manifests: list[dict[str, Any]] = []
        self._manifest_at = 0.0
        self._pending: pa.Table | None = None  # replay: spans not yet shown
        self._t0_data = 0
        self._t0_wall = 0.0
        self._writers_ended = False

    @property
    def ended(self) -> bool:
        """Every writer of the dir has finished, every part is read (and, replaying, shown)."""
        pending = self._pending is not None and self._pending.num_rows > 0
        return self._writers_ended and not pending and not self._unread

    def stats(self, path: Path) -> PartStats | None:
        """A part's footer figures, read once (parts never change)."""
        if path not in self._stats:
            self._stats[path] = part_stats(path)
        return self._stats[path]

    def extent(self) -> tuple[int, int] | None:
        """(first start, last end) of the dir's parts from their footers, or None."""
        found = [self.stats(p) for p in part_files(self.store_dir)]
        lo = min(
            (s.first_start_ns for s in found if s and s.first_start_ns is not None), default=None
        )
        hi = max((s.last_end_ns for s in found if s and s.last_end_ns is not None), default=None)
        return (lo, hi) if lo is not None and hi is not None and lo < hi else None

    def _last_end(self, path: Path) -> float:
        st = self.stats(path)
        # Without statistics a part could hold the newest spans: read it first.
        return math.inf if st is None or st.last_end_ns is None else st.last_end_ns

    def backlog(self) -> tuple[int | None, int]:
        if not self._unread:
            return None, 0
        last = self._last_end(self._unread[-1])
        rows = sum(st.rows for st in map(self.stats, self._unread) if st is not None)
        return (1 << 62 if last == math.inf else int(last)), rows

    def poll(self, feed: SpanFeed) -> None:
        # Writers are judged before the parts are listed: parts a writer left before it
        # ended are all on disk by then, so this poll lists them.
        done = writers_ended(self.manifests())
        new = [p for p in part_files(self.store_dir) if p not in self._seen]
        self._seen.update(new)
        if self.replay is not None:
            tables = (read_part(p, INGEST_COLUMNS) for p in new)
            self._replay([t for t in tables if t is not None], feed, self.replay)
            self._writers_ended = done
            return
        if new:
            self._unread = sorted(self._unread + new, key=self._last_end)
        rows = 0
        while self._unread and rows < self.POLL_SPANS:
            # Only the columns the dashboard folds in: all of them take ~8x as long.
            t = read_part(self._unread.pop(), INGEST_COLUMNS)
            if t is not None and t.num_rows:
                rows += t.num_rows
                for b in t.to_batches(max_chunksize=256_000):
                    feed.write(b)
        self._writers_ended = done

    def _replay(self, tables: list[pa.Table], feed: SpanFeed, speed: float) -> None:
        if tables:
            merged = pa.concat_tables(
                ([self._pending] if self._pending is not None else []) + tables
            )
            merged = merged.unify_dictionaries().combine_chunks()
            merged = merged.take(pc.sort_indices(merged, [("end_ns", "ascending")]))
            if self._pending is None:
                self._t0_data = int(pc.min(merged["start_ns"]).as_py())
                self._t0_wall = time.monotonic()
            self._pending = merged
        if self._pending is None or not self._pending.num_rows:
            return
        now = self._t0_data + int((time.monotonic() - self._t0_wall) * 1e9 * speed)
        ends = self._pending["end_ns"].to_numpy()
        n = int(ends.searchsorted(now, side="right"))
        if n:
            for b in self._pending.slice(0, n).to_batches(max_chunksize=256_000):
                feed.write(b)
            self._pending = self._pending.slice(n)

    def manifests(self) -> list[dict[str, Any]]:
        if time.monotonic() - self._manifest_at > 1.0:  # writers update these once a flush
            self._manifests = read_manifests([self.store_dir]) if self.store_dir.is_dir() else []
            self._manifest_at = time.monotonic()
        return self._manifests

    def stop(self) -> None:
        pass


class FeedSource:
    """An in-process producer (the emulator, a recorder) writing into the app's feed.

    Args:
        store_dir: where the producer also stores its parts (for SQL and the explorer).
        manifests: run manifests (topology) the producer knows up front.
        name: shown in the status line.
        done: set by the producer when it has finished (the viewer then says ENDED).
    """

    def __init__(
        self,
        store_dir: str | Path | None = None,
        manifests: Iterable[dict] = (),
        name: str = "in-process feed",
        done: threading.Event | None = None,
    ) -> None:
        self.store_dir = Path(store_dir) if store_dir else None
        self.name = name
        self._manifests = list(manifests)
        self._done = done

    @property
    def ended(self) -> bool:
        """The producer has returned (its `done` event is set)."""
        return self._done is not None and self._done.is_set()

    def poll(self, feed: SpanFeed) -> None:
        pass  # the producer writes into the feed itself

    def backlog(self) -> tuple[int | None, int]:
        return None, 0  # what the producer made is in the feed already

    def manifests(self) -> list[dict[str, Any]]:
        if self.store_dir is not None and self.store_dir.is_dir():
            on_disk = read_manifests([self.store_dir])
            if on_disk:
                return self._manifests + on_disk
        return self._manifests

    def stop(self) -> None:
        pass
