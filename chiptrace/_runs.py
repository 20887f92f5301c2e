"""Runs in one store that must not be analysed as one: emulated runs over the same time.

`emulate --append` adds a run to a store; each emulated run is one writer on the
emulator's virtual clock, so two of them cover the same time on the same chips, and every
busy share and MFU of the pair would add up past 100%. The report and diff refuse such a
store in one line that names the runs and the glob that reports one of them.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from chiptrace.errors import StoreError
from chiptrace.store import SPANS_DIR, expand_dirs, part_files, read_manifests

_PART_NAME = re.compile(r"^part-(?P<writer>.+)-\d+\.parquet$")


def writer_of(part: Path) -> str | None:
    """The writer id in a part's name (`part-WRITER-SEQ.parquet`), or None."""
    m = _PART_NAME.match(part.name)
    return m["writer"] if m else None


def part_extent(part: Path) -> tuple[int, int] | None:
    """(first start, last end) of a part from its footer's statistics, or None."""
    try:
        meta = pq.read_metadata(part)
    except (OSError, pa.ArrowException):
        return None
    names = meta.schema.names
    if "start_ns" not in names or "end_ns" not in names:
        return None
    si, ei = names.index("start_ns"), names.index("end_ns")
    lo, hi = None, None
    for g in range(meta.num_row_groups):
        s, e = meta.row_group(g).column(si).statistics, meta.row_group(g).column(ei).statistics
        if s is None or e is None or not s.has_min_max or not e.has_min_max:
            return None
        lo = s.min if lo is None else min(lo, s.min)
        hi = e.max if hi is None else max(hi, e.max)
    return (int(lo), int(hi)) if lo is not None and hi is not None else None


def overlapping_runs(parts: Iterable[Path]) -> list[str]:
    """Writers of emulated runs among `parts` that cover the same time: `emulate --append`
    into a store. One emulated run is one writer on the emulator's virtual clock, so two
    of them overlap on the same chips and every share and MFU would add up past 100%.

    Returns:
        The writer ids of such runs (empty when at most one, or none overlap)."""
    parts = list(parts)
    if not parts:
        return []
    dirs = {p.parent.parent if p.parent.name == SPANS_DIR else p.parent for p in parts}
    emulated = {
        str(m.get("writer_id"))
        for m in read_manifests(sorted(dirs))
        if m.get("source") == "emulator"
    }
    extent: dict[str, tuple[int, int]] = {}
    for part in parts:
        writer = writer_of(part)
        span = part_extent(part) if writer in emulated else None
        if writer is None or span is None:
            continue
        lo, hi = extent.get(writer, span)
        extent[writer] = (min(lo, span[0]), max(hi, span[1]))
    overlap: set[str] = set()
    last: tuple[str, int] | None = None  # the run reaching furthest so far, and its end
    for writer, (start, end) in sorted(extent.items(), key=lambda kv: kv[1]):
        if last is not None and start < last[1]:
            overlap.update((last[0], writer))
        if last is None or end > last[1]:
            last = (writer, end)
    return sorted(overlap, key=lambda w: (extent[w], w))


def refuse_overlapping_runs(paths: Iterable[str | os.PathLike[str]]) -> None:
    """One line, before any analysis, when the store holds emulated runs over the same
    time (`emulate --append`): their spans would add up on the same chips.

    Raises:
        StoreError: naming the runs and how to report one of them.
    """
    dirs = expand_dirs(paths)
    writers = overlapping_runs(p for d in dirs for p in part_files(d))
    if len(writers) < 2:
        return
    d = next(d for d in dirs if d.is_dir()) if any(d.is_dir() for d in dirs) else dirs[0]
    raise StoreError(
        f"{d} holds {len(writers)} emulated runs over the same time (emulate --append): "
        f"{', '.join(writers)}; their spans would add up on the same chips. Report one: "
        f"chiptrace report '{d / SPANS_DIR}/part-{writers[-1]}-*.parquet'"
    )
