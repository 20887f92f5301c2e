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

import numpy as np
import pyarrow as pa

from chiptrace.analysis.intervals import chunk_bounds, stream_union
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


def _sources(con: Any, lo: int, hi: int, cands: str) -> tuple[str, str]:
    """FROM-clause SQL for op spans and transfers, each with a `{chunk}` placeholder for a
    condition on the raw start_ns (intervals.chunk_bounds). Leaf spans only (what the
    `chip_ops` / `link_transfers` macros give) when some chip (link) span has a chip (link)
    child: an anti-join on the candidates table, whose spans are the only parents; else the
    same rows by a plain filter, which most traces allow (no chip span nests in another),
    and which costs about half the CPU of a pass over 10M spans. Times are clipped to
    [lo, hi]."""
    s, e = f"greatest(start_ns, {lo})", f"least(end_ns, {hi})"
    where = _where(lo, hi)
    chips_nest, links_nest = _nested(con, cands)
    if chips_nest:  # the chip_ops macro's rows and bounds
        op_from = (
            f"spans_raw ANTI JOIN (SELECT span_id AS id FROM {cands} WHERE chip_child) p "
            "ON p.id = span_id"
        )
        op_where = f"end_ns > {lo} AND start_ns < {hi} AND op_kind IS DISTINCT FROM 'idle'"
    else:
        op_from, op_where = "spans_raw", f"{where} AND (op_kind IS NULL OR op_kind <> 'idle')"
    ops = f"""(
        SELECT trace_id, chip_id, chip_type, op_kind, op_precision, name, op_flops, op_bytes,
               {s} AS start_ns, {e} AS end_ns
        FROM {op_from} WHERE chip_id IS NOT NULL AND {op_where} AND end_ns > start_ns
          AND {{chunk}})"""
    if links_nest:  # the link_transfers macro's rows: durations of the whole spans
        x_from = (
            f"spans_raw ANTI JOIN (SELECT span_id AS id FROM {cands} WHERE link_child) p "
            "ON p.id = span_id"
        )
        x_where = f"end_ns > {lo} AND start_ns < {hi} AND start_ns >= {-TIME_LIMIT}"
        span_s, span_e = "start_ns", "end_ns"
    else:
        x_from, x_where = "spans_raw", where
        span_s, span_e = s, f"least(greatest(end_ns, start_ns), {hi})"
    xfers = f"""(
        SELECT link_id, link_type, link_src, link_dst, op_bytes, name,
               {span_s} AS span_start_ns, {span_e} AS span_end_ns,
               {s} AS start_ns, {e} AS end_ns
        FROM {x_from} WHERE link_id IS NOT NULL AND {x_where} AND end_ns >= start_ns
          AND {{chunk}})"""
    return ops, xfers


def _all(source: str) -> str:
    """A chunked FROM-clause (see `_sources`) over every chunk at once."""
    return source.replace("{chunk}", "true")


def _util(
    con: Any, ops: str, t0: int, t1: int, w: int, spans: int, ids: dict[int, str]
) -> pa.Table:
    """Busy ns per (plot window, chip): the interval union of each chip's op spans binned
    into windows (streamed in time chunks, intervals.py); per-chip busy is its total.
    `ids`: the chip id of each key hash."""
    u = stream_union(
        con,
        f"SELECT hash(chip_id) AS k, start_ns AS s, end_ns AS e FROM {ops}",
        chunk_bounds(t0, t1, spans),
        t0=t0,
        window_ns=w,
        n_windows=(t1 - t0) // w + 1,
    )
    by_id = sorted((ids.get(k) or "", r) for k, r in u.index.items())
    names = [c for c, _ in by_id]
    per_window = u.bins[[r for _, r in by_id]].T  # (window, chip in id order)
    win, pos = np.nonzero(per_window)  # C order: by window, then chip id, as before
    return pa.table(
        {
            "window_index": pa.array(win, _I),
            "window_start_ns": pa.array(t0 + win.astype(np.int64) * w, _I),
            "chip_id": pa.array([names[p] for p in pos.tolist()], _S),
            "busy_ns": pa.array(per_window[win, pos], _I),
        }
    )


def _chip_ops(con: Any, ops: str) -> pa.Table:
    """Per (chip, op kind, precision, name): ops, op time, FLOPs, bytes (one scan), and
    `k`, the chip id's hash (the key of the busy union)."""
    return _arrow(
        con,
        f"""
        SELECT chip_id, any_value(chip_type) AS chip_type, op_kind, op_precision, name,
               count(*) AS ops, CAST(sum(end_ns - start_ns) AS BIGINT) AS op_ns,
               CAST(sum(op_flops) AS DOUBLE) AS flops, CAST(sum(op_bytes) AS DOUBLE) AS bytes,
               any_value(hash(chip_id)) AS k
        FROM {_all(ops)} GROUP BY chip_id, op_kind, op_precision, name""",
    )


# The exact median (DuckDB's `median`, quantile_cont 0.5) of each key's values from a table
# of (k, v, n): n values v. Counting distinct values streams and spills; `median` itself
# holds every value of every link in memory (1.6 GB for 100M transfers).
_MEDIAN = """
    SELECT k, CASE WHEN lo = hi OR tot % 2 = 1 THEN CAST(lo AS DOUBLE)
                   ELSE CAST(lo AS DOUBLE) + (CAST(hi AS DOUBLE) - CAST(lo AS DOUBLE)) * 0.5
              END AS m
    FROM (SELECT k, any_value(tot) AS tot,
                 arg_min(v, cum) FILTER (WHERE cum > (tot - 1) // 2) AS lo,
                 arg_min(v, cum) FILTER (WHERE cum > tot // 2) AS hi
          FROM (SELECT k, v, sum(n) OVER (PARTITION BY k ORDER BY v ROWS UNBOUNDED PRECEDING)
                         AS cum, sum(n) OVER (PARTITION BY k) AS tot
                FROM (SELECT k, v, sum(n) AS n FROM {src} GROUP BY k, v))
          GROUP BY k)"""


def _links(con: Any, xfers: str, t0: int, t1: int) -> pa.Table:
    """Per link direction: totals and medians from one streamed aggregate (transfers by
    key, bytes and duration), busy from the chunked interval union."""
    counts = f"_ct_xfer_{secrets.token_hex(4)}"
    busy = f"_ct_busy_{secrets.token_hex(4)}"
    try:
        # Grouped by the key's hash, not its three strings: half the CPU on 100M transfers.
        con.execute(f"""
        CREATE TEMP TABLE {counts} AS
        SELECT hash(link_id, link_src, link_dst) AS k, op_bytes,
               span_end_ns - span_start_ns AS dur, count(*) AS n,
               sum(end_ns - start_ns) AS xfer_ns, any_value(link_id) AS link_id,
               any_value(link_src) AS link_src, any_value(link_dst) AS link_dst,
               any_value(link_type) AS link_type,
               arg_min(name, start_ns) AS name, min(start_ns) AS first_ns
        FROM {_all(xfers)} GROUP BY ALL""")
        (rows,) = con.sql(f"SELECT coalesce(sum(n), 0) FROM {counts}").fetchall()[0]
        u = stream_union(
            con,
            f"SELECT hash(link_id, link_src, link_dst) AS k, start_ns AS s, end_ns AS e "
            f"FROM {xfers}",
            chunk_bounds(t0, t1, int(rows)),
        )
        keys = np.fromiter(u.index, np.uint64, len(u.index))
        con.register(busy, pa.table({"k": keys, "busy": u.busy[list(u.index.values())]}))
        return _arrow(
            con,
            f"""
            WITH t AS (
                SELECT k, any_value(link_id) AS link_id, any_value(link_type) AS link_type,
                       any_value(link_src) AS link_src, any_value(link_dst) AS link_dst,
                       CAST(sum(n) AS BIGINT) AS transfers,
                       CAST(coalesce(sum(CAST(op_bytes AS HUGEINT) * n), 0) AS DOUBLE) AS bytes,
                       CAST(sum(xfer_ns) AS BIGINT) AS xfer_ns,
                       arg_min(name, first_ns) AS name
                FROM {counts} GROUP BY k),
            mb AS ({_MEDIAN.format(src=f"(SELECT k, op_bytes AS v, n FROM {counts} WHERE op_bytes IS NOT NULL)")}),
            md AS ({_MEDIAN.format(src=f"(SELECT k, dur AS v, n FROM {counts})")})
            SELECT t.link_id, t.link_type, t.link_src, t.link_dst, t.transfers, t.bytes,
                   t.xfer_ns, mb.m AS median_bytes, md.m AS median_ns, t.name,
                   CAST(coalesce(b.busy, 0) AS BIGINT) AS busy_ns
            FROM t LEFT JOIN mb USING (k) LEFT JOIN md USING (k) LEFT JOIN {busy} b USING (k)
            ORDER BY t.link_id, t.link_src, t.link_dst""",
        )
    finally:
        con.execute(f"DROP TABLE IF EXISTS {counts}")
        con.unregister(busy)


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
    where = _where(lo, hi)
    t0, t1, n = _extent(con, lo, hi, where)
    w = max((t1 - t0) // max(windows, 1) + 1, 1)
    with candidates(con) as cands:
        ops, xfers = _sources(con, lo, hi, cands)
        workloads = load_workloads(con, where, lo, hi, n, cands, step_name) if n else []
        chip_ops = _chip_ops(con, ops)
        ids = dict(zip(chip_ops["k"].to_pylist(), chip_ops["chip_id"].to_pylist(), strict=True))
        chip_ops = chip_ops.drop_columns(["k"])
        util = _util(con, ops, t0, t1, w, sum(chip_ops["ops"].to_pylist()), ids)
        links = _links(con, xfers, t0, t1)
    chips, chip_ops = _typed_chips(chip_ops, util, workloads)
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
        links=_fill_types(links, "link_id", "link_type", type_of_link),
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
