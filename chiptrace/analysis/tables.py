"""Parse once: the store's spans reduced, in DuckDB, to the small tables every rule reads.

`load_tables(con)` runs a handful of aggregate scans over the store (chiptrace.analysis.scans,
each one pass over the Parquet parts) and returns a `TraceTables` of Arrow tables with one
row per chip, link, step, or (step, chip): thousands of rows, not millions. The heaviest
step is the interval union for busy time, streamed in time chunks.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from chiptrace.analysis.per_step import (
    WorkloadTables,
    busiest_first,
    empty_step_chips,
    load_workloads,
)
from chiptrace.analysis.scans import (
    TIME_LIMIT,
    chip_op_totals,
    extent,
    link_totals,
    overlap_where,
    sources,
    utilization,
)
from chiptrace.analysis.workloads import candidates
from chiptrace.schema import LINK_TYPES, chip_type_of
from chiptrace.topology import Topology, merge_topologies

COMPUTE_TYPES = ("gpu", "npu")
HOST_TYPES = ("cpu", "dpu")


def bounds(since_ns: int | None, until_ns: int | None) -> tuple[int, int]:
    """The analysed range: the given bounds, else the widest one whose arithmetic is safe."""
    lo = -TIME_LIMIT if since_ns is None else max(int(since_ns), -TIME_LIMIT)
    hi = TIME_LIMIT if until_ns is None else min(int(until_ns), TIME_LIMIT)
    return lo, max(hi, lo)


def type_of_chip(chip_id: str | None, chip_type: str | None) -> str:
    """The recorded chip type, else the one the id names (`gpu:3`), else ``other``."""
    return chip_type or chip_type_of(chip_id) or "other"


def type_of_link(link_id: str | None, link_type: str | None) -> str:
    """The recorded link type, else the one the id starts with, else ``other``."""
    if link_type:
        return link_type
    head = (link_id or "").split(":", 1)[0]
    return head if head in LINK_TYPES else "other"


def _fill_types(table: pa.Table, id_col: str, type_col: str, fill: Any) -> pa.Table:
    """Replace NULL types by the type the id names (spans from SDKs that set only the id)."""
    if table.num_rows == 0 or type_col not in table.column_names:
        return table
    ids = table.column(id_col).to_pylist()
    types = [fill(i, t) for i, t in zip(ids, table.column(type_col).to_pylist(), strict=True)]
    return table.set_column(
        table.column_names.index(type_col), type_col, pa.array(types, pa.string())
    )


@dataclass
class TraceTables:
    """What the rules read, computed once per analysis.

    Attributes:
        t0, t1: the analysed time range (Unix ns); spans: spans in it.
        chips: chip_id, chip_type, busy_ns (merged), ops, op_ns, flops, bytes.
        chip_ops: per chip, op kind, precision and name: ops, op_ns, flops, bytes.
        util: per plot window and chip: window_index, window_start_ns, chip_id, busy_ns.
        links: per link direction: link_id, link_type, link_src, link_dst, transfers,
            bytes, xfer_ns (summed), busy_ns (merged), median_bytes, median_ns.
        link_sizes: per link direction and size class (bytes in [2^c, 2^(c+1)), -1 no
            size): link_id, link_src, link_dst, size_class, transfers, bytes, span_ns
            (summed whole-span durations), min_ns (the shortest).
        workloads: each workload's steps and per-step chip figures, busiest first
            (per_step.WorkloadTables).
        steps, step_chips: those of one workload (`for_workload`), by default the first.
        lo, hi: the bounds every query clips times to.
        topology: peaks and bandwidths from the manifests (empty when none recorded).
        manifests: the writer manifests; spans_dropped: their summed drop counts.
        window_ns: width of the util windows.
    """

    t0: int
    t1: int
    spans: int
    chips: pa.Table
    chip_ops: pa.Table
    util: pa.Table
    links: pa.Table
    steps: pa.Table
    step_chips: pa.Table
    workloads: list[WorkloadTables] = field(default_factory=list)
    link_sizes: pa.Table = field(default_factory=pa.table)
    lo: int = 0
    hi: int = 0
    topology: Topology = field(default_factory=Topology)
    manifests: list[dict[str, Any]] = field(default_factory=list)
    spans_dropped: int = 0
    window_ns: int = 1

    @property
    def wall_ns(self) -> int:
        return max(self.t1 - self.t0, 1)

    def for_workload(self, w: WorkloadTables | None) -> TraceTables:
        """The same tables with `steps` and `step_chips` of workload `w` (None: no steps)."""
        if w is None:
            return dataclasses.replace(
                self, steps=_NO_STEPS.slice(0, 0), step_chips=empty_step_chips()
            )
        return dataclasses.replace(self, steps=w.steps, step_chips=w.step_chips)


_S, _I, _F = pa.string(), pa.int64(), pa.float64()
_NO_STEPS = pa.schema(
    [
        ("trace_id", _S),
        ("span_id", _S),
        ("name", _S),
        ("start_ns", _I),
        ("end_ns", _I),
        ("links", _S),
        ("proc", _S),
        ("number", _I),
    ]
).empty_table()


def _manifests(con: Any) -> list[dict[str, Any]]:
    out = []
    for (raw,) in con.sql("SELECT manifest FROM runs").fetchall():
        try:
            m = json.loads(raw)
        except (TypeError, ValueError):
            continue
        if isinstance(m, dict):
            out.append(m)
    return out


def load_tables(
    con: Any,
    since_ns: int | None = None,
    until_ns: int | None = None,
    *,
    windows: int = 120,
    step_name: str | None = None,
) -> TraceTables:
    """Reduce the store behind `con` (a `chiptrace.connect` connection) to TraceTables.

    Args:
        con: DuckDB connection with the chiptrace views and macros.
        since_ns, until_ns: analyse only this time range (Unix ns); spans are clipped.
        windows: how many time windows the utilization series has.
        step_name: a glob of the span names that mark a step (default: guessed, see
            chiptrace.analysis.workloads).

    Raises:
        StepError: `step_name` matches no span.
    """
    lo, hi = bounds(since_ns, until_ns)
    where = overlap_where(lo, hi)
    t0, t1, n = extent(con, lo, hi, where)
    w = window_width(t0, t1, windows)
    with candidates(con) as cands:
        ops, xfers = sources(con, lo, hi, cands)
        workloads = load_workloads(con, where, lo, hi, n, cands, step_name) if n else []
        chip_ops = chip_op_totals(con, ops)
        util = utilization(
            con, ops, t0, t1, w, sum(chip_ops["ops"].to_pylist()), chip_keys(chip_ops)
        )
        links, sizes = link_totals(con, xfers, t0, t1)
    scanned = Scanned(
        lo, hi, t0, t1, n, w, workloads, chip_ops.drop_columns(["k"]), util, links, sizes
    )
    return tables_of(con, scanned)


def window_width(t0: int, t1: int, windows: int) -> int:
    """The width of the utilization windows: `windows` of them over [t0, t1]."""
    return max((t1 - t0) // max(windows, 1) + 1, 1)


def chip_keys(chip_ops: pa.Table) -> dict[int, str]:
    """The chip id of each key hash (`scans.chip_op_totals`' `k`: the busy union's key)."""
    return dict(zip(chip_ops["k"].to_pylist(), chip_ops["chip_id"].to_pylist(), strict=True))


@dataclass
class Scanned:
    """What the store-wide scans give (`load_tables`; on a cluster, each share's merged:
    analysis/scan_stages.py): the range, the workloads, chip_ops (scans.chip_op_totals
    without its key), util, and links and link sizes (scans.link_totals)."""

    lo: int
    hi: int
    t0: int
    t1: int
    spans: int
    window_ns: int
    workloads: list[WorkloadTables]
    chip_ops: pa.Table
    util: pa.Table
    links: pa.Table
    sizes: pa.Table


def tables_of(con: Any, s: Scanned) -> TraceTables:
    """TraceTables from the scans' results and the writer manifests behind `con`."""
    chips, chip_ops = _typed_chips(s.chip_ops, s.util, s.workloads)
    busy = dict(zip(chips["chip_id"].to_pylist(), chips["busy_ns"].to_pylist(), strict=True))
    workloads = busiest_first(s.workloads, busy)
    manifests = _manifests(con)
    dropped = sum(int(m.get("spans_dropped") or 0) for m in manifests)
    first = workloads[0] if workloads else None
    return TraceTables(
        t0=s.t0,
        t1=s.t1,
        spans=s.spans,
        chips=chips,
        chip_ops=chip_ops,
        util=s.util,
        links=_fill_types(s.links, "link_id", "link_type", type_of_link),
        link_sizes=s.sizes,
        steps=first.steps if first else _NO_STEPS,
        step_chips=first.step_chips if first else empty_step_chips(),
        workloads=workloads,
        lo=s.lo,
        hi=s.hi,
        topology=merge_topologies(manifests),
        manifests=manifests,
        spans_dropped=dropped,
        window_ns=s.window_ns,
    )


def _typed_chips(
    chip_ops: pa.Table, util: pa.Table, workloads: list[WorkloadTables]
) -> tuple[pa.Table, pa.Table]:
    """The chips table, and chip_ops (and each workload's step_chips) with one type per
    chip: the one its spans record, else the one its id names (spans may disagree; the
    chips table decides)."""
    chip_ops = _fill_types(chip_ops, "chip_id", "chip_type", type_of_chip)
    chips = _chips(chip_ops, util)
    kind = dict(zip(chips["chip_id"].to_pylist(), chips["chip_type"].to_pylist(), strict=True))

    def fill(c: str | None, t: str | None) -> str:
        return kind.get(c) or type_of_chip(c, t)

    for wk in workloads:
        wk.step_chips = _fill_types(wk.step_chips, "chip_id", "chip_type", fill)
    return chips, _fill_types(chip_ops, "chip_id", "chip_type", fill)


def _chips(chip_ops: pa.Table, util: pa.Table) -> pa.Table:
    """Per chip: busy (merged, from the util windows), ops, summed op time, flops, bytes."""
    if chip_ops.num_rows == 0:
        cols = [("chip_id", _S), ("chip_type", _S), ("busy_ns", _I), ("ops", _I)]
        return pa.schema([*cols, ("op_ns", _I), ("flops", _F), ("bytes", _F)]).empty_table()
    per = chip_ops.group_by("chip_id").aggregate(
        [("chip_type", "max"), ("ops", "sum"), ("op_ns", "sum"), ("flops", "sum"), ("bytes", "sum")]
    )
    busy = dict(
        zip(
            *util.group_by("chip_id")
            .aggregate([("busy_ns", "sum")])
            .select(["chip_id", "busy_ns_sum"])
            .to_pydict()
            .values(),
            strict=True,
        )
    )
    ids = per.column("chip_id").to_pylist()
    out = pa.table(
        {
            "chip_id": ids,
            "chip_type": per.column("chip_type_max"),
            "busy_ns": pa.array([int(busy.get(c) or 0) for c in ids], pa.int64()),
            "ops": per.column("ops_sum"),
            "op_ns": per.column("op_ns_sum"),
            "flops": per.column("flops_sum"),
            "bytes": per.column("bytes_sum"),
        }
    )
    return out.sort_by("chip_id")
