"""Parse once: the store's spans reduced, in DuckDB, to the small tables every rule reads.

`load_tables(con)` runs a handful of aggregate queries over the store (each one scan of the
Parquet parts, using the macros of `chiptrace._macros`) and returns a `TraceTables` of Arrow
tables with one row per chip, link, step, or (step, chip): thousands of rows, not millions.
The one heavy step is the interval union for busy time (a sort of the op spans per chip).
"""

from __future__ import annotations

import dataclasses
import json
import secrets
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from chiptrace.analysis.per_step import (
    WorkloadTables,
    busiest_first,
    empty_step_chips,
    load_workloads,
)
from chiptrace.analysis.workloads import candidates
from chiptrace.schema import LINK_TYPES, chip_type_of
from chiptrace.topology import Topology, merge_topologies

COMPUTE_TYPES = ("gpu", "npu")
HOST_TYPES = ("cpu", "dpu")


# Spans outside +-2^62 ns (146 years either side of 1970) are left out and times are clipped
# to that range, so no difference of two times can overflow int64 in DuckDB.
TIME_LIMIT = 1 << 62


def bounds(since_ns: int | None, until_ns: int | None) -> tuple[int, int]:
    """The analysed range: the given bounds, else the widest one whose arithmetic is safe."""
    lo = -TIME_LIMIT if since_ns is None else max(int(since_ns), -TIME_LIMIT)
    hi = TIME_LIMIT if until_ns is None else min(int(until_ns), TIME_LIMIT)
    return lo, max(hi, lo)


def _args(lo: int, hi: int) -> str:
    return f"since_ns := {lo}, until_ns := {hi}"


def _arrow(con: Any, sql: str) -> pa.Table:
    rel = con.sql(sql)
    return rel.to_arrow_table() if hasattr(rel, "to_arrow_table") else rel.arrow()


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
    ]
).empty_table()


def _extent(con: Any, lo: int, hi: int, where: str) -> tuple[int, int, int]:
    rows = con.sql(
        f"SELECT min(greatest(start_ns, {lo})), max(least(greatest(end_ns, start_ns), {hi})), "
        f"count(*) FROM spans_raw WHERE {where}"
    ).fetchall()
    t0, t1, n = rows[0] if rows else (None, None, 0)
    t0 = lo if lo > -TIME_LIMIT else int(t0 or 0)
    t1 = hi if hi < TIME_LIMIT else int(t1 or 0)
    return t0, max(t1, t0), int(n or 0)


def _where(lo: int, hi: int) -> str:
    """SQL condition: the span overlaps [lo, hi) (or, zero-length, sits in it)."""
    return f"end_ns >= {lo} AND start_ns < {hi} AND start_ns >= {-TIME_LIMIT}"


def _nested(con: Any, cands: str) -> tuple[bool, bool]:
    """Does any chip span have a child on a chip; any link span a child on a link? (Read
    off the candidates table: the spans with children.)"""
    rows = con.sql(
        f"SELECT coalesce(bool_or(on_chip AND chip_child), false), "
        f"coalesce(bool_or(on_link AND link_child), false) FROM {cands}"
    ).fetchall()
    return (bool(rows[0][0]), bool(rows[0][1])) if rows else (False, False)


def _sources(con: Any, a: str, lo: int, hi: int, cands: str) -> tuple[str, str]:
    """FROM-clause SQL for op spans and transfers: the `chip_ops` / `link_transfers` macros
    when some chip (link) span has a chip (link) child; else the same rows by a plain filter.
    Most traces nest no chip span in another, and then skipping the anti-join and the macro's
    extra columns cuts the CPU of each pass over 10M spans by about half. Times are clipped
    to [lo, hi]."""
    s, e = f"greatest(start_ns, {lo})", f"least(end_ns, {hi})"
    where = _where(lo, hi)
    chips_nest, links_nest = _nested(con, cands)
    ops = (
        f"chip_ops({a})"
        if chips_nest
        else f"""(
        SELECT trace_id, chip_id, chip_type, op_kind, op_precision, name, op_flops, op_bytes,
               {s} AS start_ns, {e} AS end_ns
        FROM spans_raw WHERE chip_id IS NOT NULL AND {where} AND end_ns > start_ns
          AND (op_kind IS NULL OR op_kind <> 'idle'))"""
    )
    xfers = (
        f"(SELECT * FROM link_transfers({a}) WHERE span_start_ns >= {-TIME_LIMIT})"
        if links_nest
        else f"""(
        SELECT link_id, link_type, link_src, link_dst, op_bytes, name,
               {s} AS span_start_ns, least(greatest(end_ns, start_ns), {hi}) AS span_end_ns,
               {s} AS start_ns, {e} AS end_ns
        FROM spans_raw WHERE link_id IS NOT NULL AND {where} AND end_ns >= start_ns)"""
    )
    return ops, xfers


def _util(con: Any, ops: str, t0: int, w: int) -> pa.Table:
    """Busy ns per (plot window, chip): the interval union (one sort of the op spans by chip
    and start, running max of end) binned into windows; per-chip busy is its total.

    Partitioning on an ENUM of the chip ids instead of the text sorts about 1.5x faster on
    10M spans; pieces inside one window (nearly all) skip the range() unnest."""
    enum = f"_ct_chip_{secrets.token_hex(4)}"
    con.execute(
        f"CREATE TYPE {enum} AS ENUM (SELECT DISTINCT CAST(chip_id AS VARCHAR) "
        f"FROM spans_raw WHERE chip_id IS NOT NULL)"
    )
    try:
        return _arrow(
            con,
            f"""
            WITH o AS (SELECT CAST(chip_id AS {enum}) AS c, start_ns AS s, end_ns AS e
                       FROM {ops}),
            b AS (SELECT c, e, greatest(s, coalesce(max(e) OVER (PARTITION BY c ORDER BY s
                      ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), s)) AS s FROM o),
            k AS (SELECT c, s, e, (s - {t0}) // {w} AS k0, (e - 1 - {t0}) // {w} AS k1
                  FROM b WHERE e > s),
            x AS (SELECT c, k0 AS k, e - s AS d FROM k WHERE k0 = k1
                  UNION ALL
                  SELECT c, kk, least(e, {t0} + (kk + 1) * {w}) - greatest(s, {t0} + kk * {w})
                  FROM (SELECT *, unnest(range(k0, k1 + 1)) AS kk FROM k WHERE k0 < k1))
            SELECT x.k AS window_index, {t0} + x.k * {w} AS window_start_ns,
                   CAST(x.c AS VARCHAR) AS chip_id, CAST(sum(x.d) AS BIGINT) AS busy_ns
            FROM x GROUP BY x.k, x.c ORDER BY 1, 3""",
        )
    finally:
        con.execute(f"DROP TYPE IF EXISTS {enum}")


def _chip_ops(con: Any, ops: str) -> pa.Table:
    """Per (chip, op kind, precision, name): ops, op time, FLOPs, bytes (one scan)."""
    return _arrow(
        con,
        f"""
        SELECT chip_id, any_value(chip_type) AS chip_type, op_kind, op_precision, name,
               count(*) AS ops, CAST(sum(end_ns - start_ns) AS BIGINT) AS op_ns,
               CAST(sum(op_flops) AS DOUBLE) AS flops, CAST(sum(op_bytes) AS DOUBLE) AS bytes
        FROM {ops} GROUP BY chip_id, op_kind, op_precision, name""",
    )


def _links(con: Any, xfers: str) -> pa.Table:
    # One scan and one sort: totals, medians and the busy union per link direction together.
    return _arrow(
        con,
        f"""
        WITH t AS (
            SELECT link_id, link_type, link_src, link_dst, op_bytes, name, start_ns, end_ns,
                   span_end_ns - span_start_ns AS dur,
                   greatest(start_ns, coalesce(max(end_ns) OVER (
                       PARTITION BY link_id, link_src, link_dst ORDER BY start_ns
                       ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), start_ns)) AS piece
            FROM {xfers})
        SELECT link_id, any_value(link_type) AS link_type, link_src, link_dst,
               count(*) AS transfers, CAST(coalesce(sum(op_bytes), 0) AS DOUBLE) AS bytes,
               CAST(sum(end_ns - start_ns) AS BIGINT) AS xfer_ns,
               median(op_bytes) AS median_bytes, median(dur) AS median_ns,
               any_value(name) AS name,
               CAST(sum(greatest(end_ns - piece, 0)) AS BIGINT) AS busy_ns
        FROM t GROUP BY link_id, link_src, link_dst
        ORDER BY link_id, link_src, link_dst""",
    )


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
    a = _args(lo, hi)
    where = _where(lo, hi)
    t0, t1, n = _extent(con, lo, hi, where)
    w = max((t1 - t0) // max(windows, 1) + 1, 1)
    with candidates(con) as cands:
        ops, xfers = _sources(con, a, lo, hi, cands)
        workloads = load_workloads(con, where, lo, hi, n, cands, step_name) if n else []
    util = _util(con, ops, t0, w)
    chips, chip_ops = _typed_chips(_chip_ops(con, ops), util, workloads)
    busy = dict(zip(chips["chip_id"].to_pylist(), chips["busy_ns"].to_pylist(), strict=True))
    workloads = busiest_first(workloads, busy)
    manifests = _manifests(con)
    dropped = sum(int(m.get("spans_dropped") or 0) for m in manifests)
    first = workloads[0] if workloads else None
    return TraceTables(
        t0=t0,
        t1=t1,
        spans=n,
        chips=chips,
        chip_ops=chip_ops,
        util=util,
        links=_fill_types(_links(con, xfers), "link_id", "link_type", type_of_link),
        steps=first.steps if first else _NO_STEPS,
        step_chips=first.step_chips if first else empty_step_chips(),
        workloads=workloads,
        lo=lo,
        hi=hi,
        topology=merge_topologies(manifests),
        manifests=manifests,
        spans_dropped=dropped,
        window_ns=w,
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
