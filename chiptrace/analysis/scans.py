"""The store-wide scans behind `tables.load_tables`: where the op and transfer spans come
from, and their per-chip, per-link and busy-time aggregates, each one pass over the Parquet
parts (busy unions streamed in time chunks, chiptrace.analysis.intervals)."""

from __future__ import annotations

import secrets
from typing import Any

import numpy as np
import pyarrow as pa

from chiptrace.analysis.intervals import chunk_bounds, stream_union
from chiptrace.analysis.workloads import arrow

# Spans outside +-2^62 ns (146 years either side of 1970) are left out and times are clipped
# to that range, so no difference of two times can overflow int64 in DuckDB.
TIME_LIMIT = 1 << 62
_S, _I = pa.string(), pa.int64()


Extent = tuple[int | None, int | None, int]  # first start, last end (None: no span), spans


def extent_part(con: Any, lo: int, hi: int, where: str) -> Extent:
    """The clipped first start, last end and count of the spans behind `con`: the shares
    of a store (stages on a cluster) merge by min, max and sum (`merge_extent`)."""
    rows = con.sql(
        f"SELECT min(greatest(start_ns, {lo})), max(least(greatest(end_ns, start_ns), {hi})), "
        f"count(*) FROM spans_raw WHERE {where}"
    ).fetchall()
    t0, t1, n = rows[0] if rows else (None, None, 0)
    return (None if t0 is None else int(t0), None if t1 is None else int(t1), int(n or 0))


def merge_extent(parts: list[Extent], lo: int, hi: int) -> tuple[int, int, int]:
    """The analysed range (t0, t1) and its span count from the parts' extents."""
    starts = [p[0] for p in parts if p[0] is not None]
    ends = [p[1] for p in parts if p[1] is not None]
    t0 = lo if lo > -TIME_LIMIT else (min(starts) if starts else 0)
    t1 = hi if hi < TIME_LIMIT else (max(ends) if ends else 0)
    return t0, max(t1, t0), sum(p[2] for p in parts)


def extent(con: Any, lo: int, hi: int, where: str) -> tuple[int, int, int]:
    return merge_extent([extent_part(con, lo, hi, where)], lo, hi)


def overlap_where(lo: int, hi: int) -> str:
    """SQL condition: the span overlaps [lo, hi) (or, zero-length, sits in it)."""
    return f"end_ns >= {lo} AND start_ns < {hi} AND start_ns >= {-TIME_LIMIT}"


def nesting(con: Any, cands: str) -> tuple[bool, bool]:
    """Does any chip span have a child on a chip; any link span a child on a link? (Read
    off the candidates table: the spans with children.)"""
    rows = con.sql(
        f"SELECT coalesce(bool_or(on_chip AND chip_child), false), "
        f"coalesce(bool_or(on_link AND link_child), false) FROM {cands}"
    ).fetchall()
    return (bool(rows[0][0]), bool(rows[0][1])) if rows else (False, False)


def sources(
    con: Any, lo: int, hi: int, cands: str, nested: tuple[bool, bool] | None = None
) -> tuple[str, str]:
    """FROM-clause SQL for op spans and transfers, each with a `{chunk}` placeholder for a
    condition on the raw start_ns (intervals.chunk_bounds). Leaf spans only (what the
    `chip_ops` / `link_transfers` macros give) when some chip (link) span has a chip (link)
    child: an anti-join on the candidates table, whose spans are the only parents; else the
    same rows by a plain filter, which most traces allow (no chip span nests in another),
    and which costs about half the CPU of a pass over 10M spans. Times are clipped to
    [lo, hi]. `nested`: the (chips, links) answer of the whole store (`nesting`), where
    `con` holds a share of it."""
    s, e = f"greatest(start_ns, {lo})", f"least(end_ns, {hi})"
    where = overlap_where(lo, hi)
    chips_nest, links_nest = nested if nested is not None else nesting(con, cands)
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


def utilization(
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


def chip_op_totals(con: Any, ops: str) -> pa.Table:
    """Per (chip, op kind, precision, name): ops, op time, FLOPs, bytes (one scan), and
    `k`, the chip id's hash (the key of the busy union)."""
    return arrow(
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


# Per link direction and size class (bytes in [2^b, 2^(b+1)); b = -1: no size): what the
# transfer rules classify each transfer by, read off the (key, bytes, duration) counts.
_SIZES = """
    SELECT any_value(link_id) AS link_id, any_value(link_src) AS link_src,
           any_value(link_dst) AS link_dst,
           CASE WHEN op_bytes IS NULL THEN -1
                ELSE CAST(floor(log2(greatest(op_bytes, 1))) AS INTEGER) END AS size_class,
           CAST(sum(n) AS BIGINT) AS transfers,
           CAST(coalesce(sum(CAST(op_bytes AS HUGEINT) * n), 0) AS DOUBLE) AS bytes,
           CAST(sum(CAST(dur AS HUGEINT) * n) AS BIGINT) AS span_ns, min(dur) AS min_ns
    FROM {counts} GROUP BY k, size_class ORDER BY link_id, link_src, link_dst, size_class"""


def link_totals(con: Any, xfers: str, t0: int, t1: int) -> tuple[pa.Table, pa.Table]:
    """Per link direction: totals and medians from one streamed aggregate (transfers by
    key, bytes and duration), busy from the chunked interval union; and per link direction
    and size class (`_SIZES`) transfers, bytes, summed and shortest duration."""
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
        sizes = arrow(con, _SIZES.format(counts=counts))
        return arrow(
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
        ), sizes
    finally:
        con.execute(f"DROP TABLE IF EXISTS {counts}")
        con.unregister(busy)
