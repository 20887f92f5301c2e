"""Whether the files of one import are one job: a folder of unrelated traces must not be
merged and clock-aligned into one run by accident.

Files are of different jobs when their ranks say so (two files of the same rank, or
different world sizes) or their clocks do (first events more than `APART_NS` apart: the
ranks of one job start within seconds of each other, NCCL alignment fixes the rest).
`import --merge` stores them as one run anyway.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from chiptrace.importers.source import TraceFormatError

APART_NS = 3600 * 10**9  # an hour: the ranks of one job start seconds apart, not hours


def _name(path: str) -> str:
    return os.path.basename(path)


def first_ns(pending: Any) -> int | None:
    """A file's first span start on the Unix clock (None: no span)."""
    starts = [int(np.min(b.start)) for b in pending.blocks if len(b.start)]
    return min(starts) + pending.facts.base_ns if starts else None


def check_one_job(pending: list[Any]) -> None:
    """Refuse files that look like different jobs, in one line naming two of them.

    Raises:
        TraceFormatError: duplicate ranks, different world sizes, or clocks hours apart.
    """
    check_files([(p.facts, first_ns(p)) for p in pending])


def check_files(files: list[tuple[Any, int | None]]) -> None:
    """`check_one_job` from each file's facts and first span start (`first_ns`), where
    the files were read elsewhere (a task import's read tasks)."""
    facts = [f for f, _ in files]
    sizes = {f.world_size for f in facts if f.world_size is not None}
    if len(sizes) > 1:
        a = next(f for f in facts if f.world_size == min(sizes))
        b = next(f for f in facts if f.world_size == max(sizes))
        _refuse(a.path, b.path, f"world sizes {a.world_size} and {b.world_size}")
    seen: dict[int, str] = {}
    for f in facts:
        if f.rank is None:
            continue
        if f.rank in seen:
            _refuse(seen[f.rank], f.path, f"both rank {f.rank}")
        seen[f.rank] = f.path
    firsts = [(t, f.path) for f, t in files if t is not None]
    if len(firsts) > 1:
        lo, hi = min(firsts), max(firsts)
        if hi[0] - lo[0] > APART_NS:
            hours = (hi[0] - lo[0]) / 3.6e12
            _refuse(lo[1], hi[1], f"clocks {hours:,.1f} hours apart")


def _refuse(a: str, b: str, why: str) -> None:
    raise TraceFormatError(
        f"{_name(a)} and {_name(b)} look like different jobs ({why}): import them into "
        "separate dirs, or pass --merge to store them as one run"
    )
