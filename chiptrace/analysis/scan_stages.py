"""`load_tables`' store-wide scans as stages: per rank of a hive-partitioned store.

On a cluster (a remote `stages.Runner`) over a store whose parts all sit under
`spans/rank=R/` (`import --partition-by rank`), each rank's share is scanned by tasks of
its own, each with its own DuckDB over that rank's parts, in four rounds whose small
results the client merges between them:

1. `extent_stage`: the share's first start, last end and span count (the run's range and
   its utilization windows are the merged ones);
2. `scan_stage`: per chip and op (ops, time, FLOPs, bytes), the busy unions per chip binned
   into the run's windows, per link direction (totals, medians, busy) and size class, and
   what the step guess reads (workloads.family_rows, link_rows, glob_rows: rows that add
   up over shares);
3. `steps_stage`: each chosen workload's steps in the share;
4. `chips_stage`: per (sampled step, chip) figures over the run's sampled steps.

The merge is exact where the shares are separable: every span's parent in its own share
(no orphans), and no chip or link direction in two shares (a busy union or a median does
not add up). Else, as for a flat store, `load_tables` runs once over the whole store, as
one stage. A step's root links are followed within its share (the back end of a request
runs in the request's process).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from chiptrace.analysis import workloads as wl
from chiptrace.analysis.per_step import chip_sample, merge_step_chips, step_chips, workload
from chiptrace.analysis.scans import (
    Extent,
    chip_op_totals,
    extent_part,
    link_totals,
    merge_extent,
    nesting,
    overlap_where,
    sources,
    utilization,
)
from chiptrace.analysis.stages import Runner, Source, connection, rank_shares
from chiptrace.analysis.tables import (
    Scanned,
    TraceTables,
    bounds,
    chip_keys,
    load_tables,
    tables_of,
    window_width,
)


@dataclass(frozen=True)
class ScanPart:
    """One share's scans (`scan_stage`)."""

    nested: tuple[bool, bool]  # scans.nesting of this share
    orphans: int  # parent ids this share does not hold
    chip_ops: pa.Table  # scans.chip_op_totals, with its key `k`
    util: pa.Table
    links: pa.Table
    sizes: pa.Table
    families: list[tuple[Any, ...]]  # workloads.family_rows (none under --step)
    link_rows: list[tuple[Any, ...]]  # workloads.link_rows (none under --step)
    globbed: list[tuple[str, int]]  # workloads.glob_rows of --step, else of profiler steps


def extent_stage(src: Source, lo: int, hi: int) -> Extent:
    with connection(src) as con:
        return extent_part(con, lo, hi, overlap_where(lo, hi))


def scan_stage(
    src: Source,
    lo: int,
    hi: int,
    window: tuple[int, int, int],
    step_glob: str | None,
    nested: tuple[bool, bool] | None,
) -> ScanPart:
    """The share's per-chip and per-link scans over the run's windows (`window`: t0, t1,
    width) and the step guess's rows; `nested`: the whole store's answer (None: this
    share's, which the client checks against the others')."""
    t0, t1, w = window
    where = overlap_where(lo, hi)
    orphans: list[bytes] = []
    with connection(src) as con, wl.candidates(con, orphans) as cands:
        local = nesting(con, cands)
        ops, xfers = sources(con, lo, hi, cands, nested or local)
        chip_ops = chip_op_totals(con, ops)
        spans = sum(chip_ops["ops"].to_pylist())
        util = utilization(con, ops, t0, t1, w, spans, chip_keys(chip_ops))
        links, sizes = link_totals(con, xfers, t0, t1)
        if step_glob:
            fams: list[tuple[Any, ...]] = []
            linked: list[tuple[Any, ...]] = []
        else:
            fams = wl.family_rows(con, wl.in_window(cands, where))
            linked = wl.link_rows(con, wl.in_window(cands, where))
        globbed = wl.glob_rows(con, where, step_glob or wl.PROFILER_STEPS)
    return ScanPart(local, len(orphans), chip_ops, util, links, sizes, fams, linked, globbed)


def steps_stage(src: Source, lo: int, hi: int, choices: list[wl.StepChoice]) -> list[pa.Table]:
    """Each workload's steps in the share (workloads.step_rows)."""
    where = overlap_where(lo, hi)
    with connection(src) as con:
        if all(c.glob for c in choices):
            return [wl.step_rows(con, c, where, None) for c in choices]
        with wl.candidates(con) as cands:
            guessed = wl.in_window(cands, where)
            return [wl.step_rows(con, c, where, None if c.glob else guessed) for c in choices]


def chips_stage(
    src: Source, lo: int, hi: int, steps: list[pa.Table], max_steps: int, links: bool
) -> list[tuple[pa.Table, frozenset[str]]]:
    """Per workload: per_step.step_chips of the run's steps, over the share's spans."""
    where = overlap_where(lo, hi)
    with connection(src) as con:
        return [step_chips(con, s, where, lo, hi, max_steps, links) for s in steps]


def whole_stage(
    src: Source, since_ns: int | None, until_ns: int | None, windows: int, step_name: str | None
) -> TraceTables:
    with connection(src) as con:
        return load_tables(con, since_ns, until_ns, windows=windows, step_name=step_name)


def store_tables(
    runner: Runner,
    con: Any,
    sources_: Sequence[str],
    since_ns: int | None,
    until_ns: int | None,
    *,
    windows: int = 120,
    step_name: str | None = None,
) -> TraceTables:
    """tables.load_tables of the store: here (in process), per rank on a cluster (the
    module docstring), else in one stage over the whole store."""
    if not runner.remote:
        return load_tables(con, since_ns, until_ns, windows=windows, step_name=step_name)
    shares = rank_shares(sources_) if sources_ else None
    scanned = (
        None
        if shares is None
        else _scan_shares(runner, con, shares, since_ns, until_ns, windows, step_name)
    )
    if scanned is not None:
        return tables_of(con, scanned)
    src = tuple(os.fspath(Path(s).resolve()) for s in sources_)
    (whole,) = runner.map("tables", whole_stage, [(src, since_ns, until_ns, windows, step_name)])
    out: TraceTables = whole
    return out


def _scan_shares(
    runner: Runner,
    con: Any,
    shares: list[tuple[str, ...]],
    since_ns: int | None,
    until_ns: int | None,
    windows: int,
    step_name: str | None,
) -> Scanned | None:
    lo, hi = bounds(since_ns, until_ns)
    t0, t1, n = merge_extent(
        runner.map("extent", extent_stage, [(s, lo, hi) for s in shares]), lo, hi
    )
    window = (t0, t1, window_width(t0, t1, windows))
    parts: list[ScanPart] = runner.map(
        "scan", scan_stage, [(s, lo, hi, window, step_name, None) for s in shares]
    )
    nested = (any(p.nested[0] for p in parts), any(p.nested[1] for p in parts))
    # A share that answered alone otherwise: its ops and transfers as the whole store's are.
    again = [i for i, p in enumerate(parts) if p.nested != nested]
    redone = runner.map(
        "scan", scan_stage, [(shares[i], lo, hi, window, step_name, nested) for i in again]
    )
    for i, p in zip(again, redone, strict=True):
        parts[i] = p
    if not _separable(parts):
        return None
    chip_ops = _concat([p.chip_ops for p in parts]).drop_columns(["k"])
    util = _concat([p.util for p in parts]).sort_by(
        [("window_index", "ascending"), ("chip_id", "ascending")]
    )
    link_key = [(k, "ascending") for k in ("link_id", "link_src", "link_dst")]
    links = _concat([p.links for p in parts]).sort_by(link_key)
    sizes = _concat([p.sizes for p in parts]).sort_by([*link_key, ("size_class", "ascending")])
    workloads = _workloads(runner, con, shares, parts, lo, hi, n, step_name) if n else []
    return Scanned(lo, hi, t0, t1, n, window[2], workloads, chip_ops, util, links, sizes)


def _concat(tables: list[pa.Table]) -> pa.Table:
    return pa.concat_tables(tables, promote_options="permissive")


def _separable(parts: list[ScanPart]) -> bool:
    """Whether the shares' results merge exactly: no span's parent in another share, no
    chip or link direction in two shares."""
    if any(p.orphans for p in parts):
        return False
    chips = [set(p.chip_ops["chip_id"].to_pylist()) for p in parts]
    links = [
        set(
            zip(*(p.links[c].to_pylist() for c in ("link_id", "link_src", "link_dst")), strict=True)
        )
        for p in parts
    ]
    return all(sum(len(s) for s in sets) == len(set().union(*sets)) for sets in (chips, links))


def _workloads(
    runner: Runner,
    con: Any,
    shares: list[tuple[str, ...]],
    parts: list[ScanPart],
    lo: int,
    hi: int,
    n: int,
    step_name: str | None,
) -> list[Any]:
    """per_step.load_workloads from the shares' rows: the choice made here on every
    share's rows, each workload's steps and per-step chips from every share, merged."""
    globbed = [r for p in parts for r in p.globbed]
    if step_name:
        choices = wl.choose_from(globbed, step_name)
        if not choices:
            wl.no_match(con, overlap_where(lo, hi), step_name)
    else:
        choices = wl.guess_from(
            [r for p in parts for r in p.families],
            lambda: [r for p in parts for r in p.link_rows],
            lambda: globbed,
        )
    if not choices:
        return []
    per_share = runner.map("steps", steps_stage, [(s, lo, hi, choices) for s in shares])
    rows = [wl.merge_step_rows([t[i] for t in per_share]) for i in range(len(choices))]
    max_steps, links = chip_sample(n, rows)
    chips = runner.map(
        "step-chips", chips_stage, [(s, lo, hi, rows, max_steps, links) for s in shares]
    )
    out = []
    for i, (choice, steps) in enumerate(zip(choices, rows, strict=True)):
        sc = merge_step_chips([c[i][0] for c in chips])
        used = frozenset().union(*(c[i][1] for c in chips))
        out.append(workload(choice, steps, sc, used))
    return out
