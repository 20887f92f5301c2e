"""Parse once: the store's spans reduced, in DuckDB, to the small tables every rule reads.

`load_tables(con)` runs a handful of aggregate queries over the store (each one scan of the
Parquet parts, using the macros of `chiptrace._macros`) and returns a `TraceTables` of Arrow
tables with one row per chip, link, step, or (step, chip): thousands of rows, not millions.
The one heavy step is the interval union for busy time (a sort of the op spans per chip).
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from chiptrace.analysis.topology import Topology, merge_topologies

COMPUTE_TYPES = ("gpu", "npu")
STRAGGLER_STEPS = 128  # steps the per-step, per-chip figures are taken from
HOST_TYPES = ("cpu", "dpu")


def _args(since_ns: int | None, until_ns: int | None) -> str:
    s = "NULL" if since_ns is None else str(int(since_ns))
    u = "NULL" if until_ns is None else str(int(until_ns))
    return f"since_ns := {s}, until_ns := {u}"


def _arrow(con: Any, sql: str) -> pa.Table:
    rel = con.sql(sql)
    return rel.to_arrow_table() if hasattr(rel, "to_arrow_table") else rel.arrow()


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
        steps: step roots: trace_id (hex), span_id (hex), name, start_ns, end_ns.
        step_chips: per step and chip (up to STRAGGLER_STEPS steps spread over the run):
            trace_id, chip_id, chip_type, first_ns, last_ns, op_ns.
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
    topology: Topology = field(default_factory=Topology)
    manifests: list[dict[str, Any]] = field(default_factory=list)
    spans_dropped: int = 0
    window_ns: int = 1

    @property
    def wall_ns(self) -> int:
        return max(self.t1 - self.t0, 1)


def _extent(con: Any, a: str, where: str) -> tuple[int, int, int]:
    rows = con.sql(
        f"SELECT (SELECT t0 FROM span_extent({a})), (SELECT t1 FROM span_extent({a})), "
        f"count(*) FROM spans_raw WHERE {where}"
    ).fetchall()
    t0, t1, n = rows[0] if rows else (None, None, 0)
    return int(t0 or 0), int(t1 or 0), int(n or 0)


def _where(since_ns: int | None, until_ns: int | None) -> str:
    """SQL condition: the span overlaps [since_ns, until_ns)."""
    conds = ["TRUE"]
    if since_ns is not None:
        conds.append(f"end_ns > {int(since_ns)}")
    if until_ns is not None:
        conds.append(f"start_ns < {int(until_ns)}")
    return " AND ".join(conds)


def _nested(con: Any) -> tuple[bool, bool]:
    """Does any chip span have a child on a chip; any link span a child on a link? (One
    scan of span ids against the few parent ids.)"""
    rows = con.sql("""
        WITH pc AS (SELECT DISTINCT parent_span_id AS id FROM spans_raw
                    WHERE chip_id IS NOT NULL AND parent_span_id IS NOT NULL),
        pl AS (SELECT DISTINCT parent_span_id AS id FROM spans_raw
               WHERE link_id IS NOT NULL AND parent_span_id IS NOT NULL)
        SELECT coalesce(bool_or(chip_id IS NOT NULL AND span_id IN (SELECT id FROM pc)), false),
               coalesce(bool_or(link_id IS NOT NULL AND span_id IN (SELECT id FROM pl)), false)
        FROM spans_raw WHERE chip_id IS NOT NULL OR link_id IS NOT NULL""").fetchall()
    return (bool(rows[0][0]), bool(rows[0][1])) if rows else (False, False)


def _sources(con: Any, a: str, since_ns: int | None, until_ns: int | None) -> tuple[str, str]:
    """FROM-clause SQL for op spans and transfers: the `chip_ops` / `link_transfers` macros
    when some chip (link) span has a chip (link) child; else the same rows by a plain filter.
    Most traces nest no chip span in another, and then skipping the anti-join and the macro's
    extra columns cuts the CPU of each pass over 10M spans by about half."""
    lo = f"greatest(start_ns, {int(since_ns)})" if since_ns is not None else "start_ns"
    hi = f"least(end_ns, {int(until_ns)})" if until_ns is not None else "end_ns"
    where = _where(since_ns, until_ns)
    chips_nest, links_nest = _nested(con)
    ops = (
        f"chip_ops({a})"
        if chips_nest
        else f"""(
        SELECT trace_id, chip_id, chip_type, op_kind, op_precision, name, op_flops, op_bytes,
               {lo} AS start_ns, {hi} AS end_ns
        FROM spans_raw WHERE chip_id IS NOT NULL AND {where} AND end_ns > start_ns
          AND (op_kind IS NULL OR op_kind <> 'idle'))"""
    )
    xfers = (
        f"link_transfers({a})"
        if links_nest
        else f"""(
        SELECT link_id, link_type, link_src, link_dst, op_bytes, name,
               start_ns AS span_start_ns, end_ns AS span_end_ns, {lo} AS start_ns, {hi} AS end_ns
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


def _step_chips(
    con: Any,
    steps: pa.Table,
    since_ns: int | None,
    until_ns: int | None,
    max_steps: int = STRAGGLER_STEPS,
) -> pa.Table:
    """Per (step, chip) for the straggler rule, over at most `max_steps` steps spread over
    the run. Filtering on trace ids is cheap in Parquet (about 0.1 CPU-s on 10M spans, where
    grouping every op by step costs 2), and a median needs no more steps than that."""
    n = steps.num_rows
    if n == 0:
        return _empty_step_chips()
    stride = max(n // max_steps, 1)
    ids = steps.column("trace_id").to_pylist()[::stride][:max_steps]
    in_list = ", ".join(f"unhex('{i}')" for i in ids)
    lo = f"greatest(start_ns, {int(since_ns)})" if since_ns is not None else "start_ns"
    hi = f"least(end_ns, {int(until_ns)})" if until_ns is not None else "end_ns"
    return _arrow(
        con,
        f"""
        WITH s AS (SELECT trace_id, span_id, parent_span_id, chip_id, chip_type, op_kind,
                          {lo} AS start_ns, {hi} AS end_ns
                   FROM spans_raw WHERE trace_id IN ({in_list}) AND {_where(since_ns, until_ns)}),
        p AS (SELECT DISTINCT parent_span_id AS id FROM s WHERE chip_id IS NOT NULL)
        SELECT lower(hex(trace_id)) AS trace_id, chip_id, any_value(chip_type) AS chip_type,
               min(start_ns) AS first_ns, max(end_ns) AS last_ns,
               CAST(sum(end_ns - start_ns) AS BIGINT) AS op_ns
        FROM s ANTI JOIN p ON p.id = s.span_id
        WHERE chip_id IS NOT NULL AND op_kind IS DISTINCT FROM 'idle' AND end_ns > start_ns
        GROUP BY trace_id, chip_id""",
    )


def _empty_step_chips() -> pa.Table:
    return pa.table(
        {
            "trace_id": pa.array([], pa.string()),
            "chip_id": pa.array([], pa.string()),
            "chip_type": pa.array([], pa.string()),
            "first_ns": pa.array([], pa.int64()),
            "last_ns": pa.array([], pa.int64()),
            "op_ns": pa.array([], pa.int64()),
        }
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
               count(*) AS transfers, CAST(sum(op_bytes) AS DOUBLE) AS bytes,
               CAST(sum(end_ns - start_ns) AS BIGINT) AS xfer_ns,
               median(op_bytes) AS median_bytes, median(dur) AS median_ns,
               any_value(name) AS name,
               CAST(sum(greatest(end_ns - piece, 0)) AS BIGINT) AS busy_ns
        FROM t GROUP BY link_id, link_src, link_dst
        ORDER BY link_id, link_src, link_dst""",
    )


def _steps(con: Any, where: str, step_name: str | None) -> pa.Table:
    # A step is a root span with children; the most common such root name is "the step".
    roots = _arrow(
        con,
        f"""
        WITH p AS (SELECT DISTINCT parent_span_id AS id FROM spans_raw
                   WHERE parent_span_id IS NOT NULL AND {where})
        SELECT lower(hex(trace_id)) AS trace_id, lower(hex(span_id)) AS span_id,
               CAST(name AS VARCHAR) AS name, start_ns, end_ns
        FROM spans_raw s SEMI JOIN p ON p.id = s.span_id
        WHERE s.parent_span_id IS NULL AND {where}
        ORDER BY start_ns""",
    )
    if roots.num_rows == 0:
        return roots
    names = roots.column("name").to_pylist()
    if step_name is None or step_name not in names:
        step_name = max(set(names), key=lambda n: (names.count(n), n))
    return roots.filter(pa.array([n == step_name for n in names], pa.bool_()))


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
        step_name: the root span name that marks a step (default: the most common root).
    """
    a = _args(since_ns, until_ns)
    where = _where(since_ns, until_ns)
    t0, t1, n = _extent(con, a, where)
    w = max((t1 - t0) // max(windows, 1) + 1, 1)
    ops, xfers = _sources(con, a, since_ns, until_ns)
    chip_ops = _chip_ops(con, ops)
    steps = _steps(con, where, step_name)
    util = _util(con, ops, t0, w)
    chips = _chips(chip_ops, util)
    manifests = _manifests(con)
    dropped = sum(int(m.get("spans_dropped") or 0) for m in manifests)
    return TraceTables(
        t0=t0,
        t1=t1,
        spans=n,
        chips=chips,
        chip_ops=chip_ops,
        util=util,
        links=_links(con, xfers),
        steps=steps,
        step_chips=_step_chips(con, steps, since_ns, until_ns),
        topology=merge_topologies(manifests),
        manifests=manifests,
        spans_dropped=dropped,
        window_ns=w,
    )


def _chips(chip_ops: pa.Table, util: pa.Table) -> pa.Table:
    """Per chip: busy (merged, from the util windows), ops, summed op time, flops, bytes."""
    if chip_ops.num_rows == 0:
        return pa.table(
            {
                "chip_id": pa.array([], pa.string()),
                "chip_type": pa.array([], pa.string()),
                "busy_ns": pa.array([], pa.int64()),
                "ops": pa.array([], pa.int64()),
                "op_ns": pa.array([], pa.int64()),
                "flops": pa.array([], pa.float64()),
                "bytes": pa.array([], pa.float64()),
            }
        )
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
