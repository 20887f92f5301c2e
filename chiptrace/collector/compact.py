"""Compaction of a partitioned collector's small parts: a few files per partition, not one
per flush.

With `--partition-by host`, each flush writes one part per host that sent spans since the
last, so 1,000 hosts flushed 10 times made 10,000 small files (a `count(*)` took 23 s).
After a flush, every partition holding `min_parts` small parts of this collector has them
merged into one, named after the log records it holds (`part-W-FIRST-LAST.parquet`, the
union of its members' ranges).

Only parts whose records have all left the write-ahead log are merged (the spool rotates
the log at each flush, so that is every part of the flushes before): a replay after a kill
never sees a merged range, so the exactly-once rules of wal_replay hold unchanged. The
merged part is made durable before its members are deleted; a kill between the two leaves
a part whose range holds another's of the same writer in the same folder, which
`drop_merged` (run when the next collector starts) deletes.
"""

from __future__ import annotations

import logging
import re
import threading
from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from chiptrace.collector.wal import PartTag
from chiptrace.store import SPAN_WRITE_OPTIONS, SPANS_DIR, write_atomic

log = logging.getLogger("chiptrace")

COMPACT_MIN_PARTS = 4
COMPACT_MAX_ROWS = 50_000  # a part this large stays as it is
_TAGGED = re.compile(r"^part-(?P<writer>.+)-(?P<first>\d{12})-(?P<last>\d{12})\.parquet$")


@dataclass(frozen=True)
class _Part:
    path: Path
    first: int
    last: int
    rows: int


class Compactor:
    """Remembers the small parts one collector wrote, per partition, and merges them.

    Args:
        writer: the collector's writer id (its log records name the parts).
        sync: makes what was written under the store durable (sink.sync_filesystem).
    """

    def __init__(
        self,
        writer: str,
        sync: Callable[[], None],
        min_parts: int = COMPACT_MIN_PARTS,
        max_rows: int = COMPACT_MAX_ROWS,
        options: Mapping[str, Any] = SPAN_WRITE_OPTIONS,
    ) -> None:
        self.writer = writer
        self.sync = sync
        self.min_parts = max(2, min_parts)
        self.max_rows = max_rows
        self.options = options
        self.removed = 0  # files merged away
        self._parts: dict[Path, list[_Part]] = defaultdict(list)
        self._lock = threading.Lock()

    def add(self, path: Path, tag: PartTag, rows: int) -> None:
        """A part the collector wrote (a small one is kept in mind for merging).

        A large part ends what can be merged in its folder: a merge is named after the
        range from its first member to its last, and a part of the same writer inside that
        range would read as one of its members (drop_merged would delete it). So the
        small parts before it are forgotten (left as they are), and later ones merge.
        """
        with self._lock:
            parts = self._parts[path.parent]
            if rows >= self.max_rows:
                parts.clear()
            elif all(p.path != path for p in parts):  # a part written again is one part
                parts.append(_Part(path, tag.first, tag.last, rows))

    def run(self, released_through: int, stop: Callable[[], bool] = lambda: False) -> int:
        """Merge the small parts of each partition that has `min_parts` of them holding
        only log records <= `released_through`; stops between partitions once `stop()`
        says so. Returns the files merged away."""
        with self._lock:
            due = []
            for folder, parts in self._parts.items():
                members = [p for p in parts if p.last <= released_through]
                if len(members) >= self.min_parts:
                    due.append((folder, members))
        merged = []
        for folder, members in due:
            if stop():
                break
            try:
                merged.append((folder, members, self._merge(folder, members)))
            except (OSError, pa.ArrowException) as e:  # kept as they are; not tried again
                log.warning("chiptrace: could not compact the parts in %s: %s", folder, e)
                self._forget(folder, members, None)
        if not merged:
            return 0
        self.sync()  # every merged part on disk before any of its members goes
        removed = 0
        for folder, members, part in merged:
            for m in members:
                m.path.unlink(missing_ok=True)
                removed += 1
            self._forget(folder, members, part)
        self.sync()  # and the deletions, so a power loss brings no member back beside it
        self.removed += removed
        return removed

    def _merge(self, folder: Path, members: list[_Part]) -> _Part:
        table = pa.concat_tables(
            [pq.read_table(m.path) for m in members], promote_options="default"
        )
        tag = PartTag(self.writer, min(m.first for m in members), max(m.last for m in members))
        path = folder / tag.name
        write_atomic(path, lambda tmp: pq.write_table(table, tmp, **self.options), sync=False)
        return _Part(path, tag.first, tag.last, table.num_rows)

    def _forget(self, folder: Path, members: list[_Part], merged: _Part | None) -> None:
        with self._lock:
            left = [p for p in self._parts[folder] if p not in members]
            if merged is not None and merged.rows < self.max_rows:
                left.append(merged)
            if left:
                self._parts[folder] = left
            else:
                del self._parts[folder]


def drop_merged(directory: Path) -> int:
    """Delete parts left beside the merged part that holds them (a collector killed between
    writing a merge and deleting its members); returns how many."""
    root = directory / SPANS_DIR
    if not root.is_dir():
        return 0
    ranges: dict[tuple[Path, str], list[tuple[int, int, Path]]] = defaultdict(list)
    for path in root.rglob("part-*.parquet"):
        m = _TAGGED.match(path.name)
        if m:
            ranges[(path.parent, m["writer"])].append((int(m["first"]), int(m["last"]), path))
    dropped = 0
    for parts in ranges.values():
        if len(parts) < 2:
            continue
        for first, last, path in parts:
            if any(f <= first and last <= la and (f, la) != (first, last) for f, la, _ in parts):
                path.unlink(missing_ok=True)
                dropped += 1
    if dropped:
        log.warning(
            "chiptrace: deleted %d part(s) a killed collector had already merged into another",
            dropped,
        )
    return dropped
