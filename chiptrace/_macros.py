"""Analysis views and table macros installed on every `chiptrace.connect()` connection.

SQL text only (plus `install`): the analysis package builds on these, and `chiptrace query`
users call them directly, e.g. ``SELECT * FROM utilization(10) WHERE chip_type = 'gpu'``.
docs/sql.md ("Analysis views and macros") documents each one.

Every macro takes optional ``since_ns`` / ``until_ns`` (Unix ns) to restrict the work to a
time range; spans are clipped to it. Busy time counts only *op* spans: spans with a chip_id,
an op kind other than ``idle``, and no child span on a chip (so a chip-tagged function that
wraps chip-tagged work is not counted twice). Overlapping op spans on one chip are merged
(interval union: sort by start, running max of end), so busy time never exceeds wall time.
`chip_busy()` gives the union as disjoint pieces (one per span that adds busy time).
"""

from __future__ import annotations

from typing import Any

from chiptrace.topology import ID_KEYS, KEYS, TYPE_KEYS

# Op spans: leaf work on a chip. The parents of chip spans are few (steps, phases), so the
# anti-join builds its hash table on them, not on millions of children (0.4 s, not 4 s, on 10M).
# Children are looked for over the whole store: leafness must not depend on the window.
OPS = """
CREATE OR REPLACE MACRO chip_ops(since_ns := NULL, until_ns := NULL) AS TABLE
WITH p AS (SELECT DISTINCT parent_span_id AS id FROM spans_raw
           WHERE chip_id IS NOT NULL AND parent_span_id IS NOT NULL)
SELECT s.trace_id, s.span_id, s.parent_span_id, s.name, s.chip_id, s.chip_type, s.op_kind,
       s.op_precision, s.op_flops, s.op_bytes, s.links,
       greatest(s.start_ns, coalesce(since_ns, s.start_ns)) AS start_ns,
       least(s.end_ns, coalesce(until_ns, s.end_ns)) AS end_ns
FROM spans_raw s ANTI JOIN p ON p.id = s.span_id
WHERE s.chip_id IS NOT NULL AND s.op_kind IS DISTINCT FROM 'idle' AND s.end_ns > s.start_ns
  AND (since_ns IS NULL OR s.end_ns > since_ns) AND (until_ns IS NULL OR s.start_ns < until_ns)
"""

# Transfers: leaf spans on a link. A link direction is its own resource (full duplex).
TRANSFERS = """
CREATE OR REPLACE MACRO link_transfers(since_ns := NULL, until_ns := NULL) AS TABLE
WITH p AS (SELECT DISTINCT parent_span_id AS id FROM spans_raw
           WHERE link_id IS NOT NULL AND parent_span_id IS NOT NULL)
SELECT s.trace_id, s.span_id, s.parent_span_id, s.name, s.link_id, s.link_type, s.link_src,
       s.link_dst, s.op_kind, s.op_bytes, s.start_ns AS span_start_ns, s.end_ns AS span_end_ns,
       greatest(s.start_ns, coalesce(since_ns, s.start_ns)) AS start_ns,
       least(s.end_ns, coalesce(until_ns, s.end_ns)) AS end_ns
FROM spans_raw s ANTI JOIN p ON p.id = s.span_id
WHERE s.link_id IS NOT NULL AND s.end_ns >= s.start_ns
  AND (since_ns IS NULL OR s.end_ns > since_ns) AND (until_ns IS NULL OR s.start_ns < until_ns)
"""

# Interval union per chip in one sorted pass: each span contributes the part of it after
# every earlier-starting span on that chip has ended (the running max of end). The pieces
# are disjoint and their union is the chip's busy time; sum(end_ns - start_ns) is busy ns.
CHIP_BUSY = """
CREATE OR REPLACE MACRO chip_busy(since_ns := NULL, until_ns := NULL) AS TABLE
SELECT * FROM (
    SELECT chip_id, chip_type,
           greatest(start_ns, coalesce(max(end_ns) OVER (
               PARTITION BY chip_id ORDER BY start_ns, end_ns
               ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), start_ns)) AS start_ns,
           end_ns
    FROM chip_ops(since_ns := since_ns, until_ns := until_ns))
WHERE end_ns > start_ns
"""

LINK_BUSY = """
CREATE OR REPLACE MACRO link_busy(since_ns := NULL, until_ns := NULL) AS TABLE
SELECT * FROM (
    SELECT link_id, link_type, link_src, link_dst,
           greatest(start_ns, coalesce(max(end_ns) OVER (
               PARTITION BY link_id, link_src, link_dst ORDER BY start_ns, end_ns
               ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), start_ns)) AS start_ns,
           end_ns
    FROM link_transfers(since_ns := since_ns, until_ns := until_ns))
WHERE end_ns > start_ns
"""

# The time range the windows are laid on: the given bounds, else the spans' extent.
SPAN_EXTENT = """
CREATE OR REPLACE MACRO span_extent(since_ns := NULL, until_ns := NULL) AS TABLE
SELECT coalesce(since_ns, min(start_ns)) AS t0, coalesce(until_ns, max(end_ns)) AS t1
FROM spans_raw
WHERE (since_ns IS NULL OR end_ns > since_ns) AND (until_ns IS NULL OR start_ns < until_ns)
"""

UTILIZATION = """
CREATE OR REPLACE MACRO utilization(window_ms, since_ns := NULL, until_ns := NULL) AS TABLE
WITH t AS (SELECT t0, t1, greatest(CAST(window_ms * 1e6 AS BIGINT), 1) AS w
           FROM span_extent(since_ns := since_ns, until_ns := until_ns)),
x AS (
    SELECT b.chip_id, b.chip_type, b.start_ns, b.end_ns, t.t0, t.t1, t.w,
           unnest(range((b.start_ns - t.t0) // t.w, (b.end_ns - 1 - t.t0) // t.w + 1)) AS k
    FROM chip_busy(since_ns := since_ns, until_ns := until_ns) b, t)
SELECT k AS window_index, t0 + k * w AS window_start_ns, chip_id, any_value(chip_type) AS chip_type,
       CAST(sum(least(end_ns, t0 + (k + 1) * w) - greatest(start_ns, t0 + k * w)) AS BIGINT)
         AS busy_ns,
       sum(least(end_ns, t0 + (k + 1) * w) - greatest(start_ns, t0 + k * w))
         / greatest(least(any_value(t1), t0 + (k + 1) * w) - (t0 + k * w), 1) AS utilization
FROM x GROUP BY k, t0, w, chip_id
"""

# Mean over every chip of the type seen in the range, so idle chips pull the mean down.
UTILIZATION_BY_TYPE = """
CREATE OR REPLACE MACRO utilization_by_type(window_ms, since_ns := NULL, until_ns := NULL) AS TABLE
WITH u AS (SELECT * FROM utilization(window_ms, since_ns := since_ns, until_ns := until_ns)),
n AS (SELECT chip_type, count(DISTINCT chip_id) AS chips
      FROM chip_ops(since_ns := since_ns, until_ns := until_ns) GROUP BY chip_type)
SELECT u.window_index, u.window_start_ns, u.chip_type, n.chips,
       sum(u.utilization) / n.chips AS utilization
FROM u JOIN n USING (chip_type)
GROUP BY u.window_index, u.window_start_ns, u.chip_type, n.chips
"""


def _figure_sql(figure: str) -> str:
    """SQL for one figure of a manifest link `j`, from chiptrace.topology's key table: the
    first key holding a number > 0, times its unit. The same rule as `parse_topology`, so
    the SQL views, the report and the dashboard read a manifest alike."""
    terms = ", ".join(
        f"CASE WHEN TRY_CAST(j->>'{key}' AS DOUBLE) > 0 "
        f"THEN TRY_CAST(j->>'{key}' AS DOUBLE) * {mult!r} END"
        for key, mult in KEYS[figure].items()
    )
    return f"coalesce({terms})"


# Link bandwidth in bytes/s from the run manifests' topology, where the run recorded one
# (a list of links; chiptrace.topology also reads a table by id).
TOPOLOGY_LINKS = f"""
CREATE OR REPLACE VIEW topology_links AS
WITH l AS (
    SELECT unnest(CAST(json_extract(manifest, '$.topology.links') AS JSON[])) AS j FROM runs
    WHERE json_type(json_extract(manifest, '$.topology.links')) = 'ARRAY'),
k AS (SELECT j, coalesce({", ".join(f"nullif(j->>'{k}', '')" for k in ID_KEYS["links"])}) AS link_id
      FROM l)
SELECT DISTINCT
       link_id,
       coalesce({", ".join(f"nullif(j->>'{k}', '')" for k in TYPE_KEYS["links"])},
                split_part(link_id, ':', 1)) AS link_type,
       {_figure_sql("bandwidth")} AS bandwidth_Bps,
       {_figure_sql("latency_ns")} AS latency_ns
FROM k WHERE link_id IS NOT NULL
"""

# Device work and the call that launched it (an imported trace's `launch` links), with the
# launch delay as HolisticTraceAnalysis defines it: device start minus the call's end.
LAUNCHES = """
CREATE OR REPLACE VIEW launches AS
WITH d AS (
    SELECT trace_id, span_id, name, chip_id, op_kind, start_ns, end_ns,
           unhex(links->>'$[0].span_id') AS launch_id
    FROM spans_raw
    WHERE links IS NOT NULL AND links->>'$[0].attributes.kind' = 'launch')
SELECT lower(hex(d.trace_id)) AS trace_id, lower(hex(d.span_id)) AS span_id, d.name,
       d.chip_id, d.op_kind, d.start_ns, d.end_ns,
       lower(hex(l.span_id)) AS launch_span_id, l.name AS launch_name,
       l.chip_id AS launch_chip_id, l.start_ns AS launch_start_ns, l.end_ns AS launch_end_ns,
       d.start_ns - l.end_ns AS launch_delay_ns
FROM d JOIN spans_raw l ON l.span_id = d.launch_id
"""

LINK_THROUGHPUT = """
CREATE OR REPLACE MACRO link_throughput(window_ms, since_ns := NULL, until_ns := NULL) AS TABLE
WITH t AS (SELECT t0, t1, greatest(CAST(window_ms * 1e6 AS BIGINT), 1) AS w
           FROM span_extent(since_ns := since_ns, until_ns := until_ns)),
x AS (
    SELECT r.link_id, r.link_type, r.link_src, r.link_dst, r.start_ns, r.end_ns, r.op_bytes,
           greatest(r.span_end_ns - r.span_start_ns, 1) AS dur, t.t0, t.t1, t.w,
           unnest(range((r.start_ns - t.t0) // t.w,
                        (greatest(r.end_ns, r.start_ns + 1) - 1 - t.t0) // t.w + 1)) AS k
    FROM link_transfers(since_ns := since_ns, until_ns := until_ns) r, t),
agg AS (
    SELECT k AS window_index, t0 + k * w AS window_start_ns, link_id, any_value(link_type) AS link_type,
           link_src, link_dst, count(*) AS transfers,
           -- bytes spread evenly over each transfer's duration
           sum(coalesce(op_bytes, 0) * greatest(least(end_ns, t0 + (k + 1) * w)
               - greatest(start_ns, t0 + k * w), CASE WHEN end_ns = start_ns THEN 1 ELSE 0 END)
               / CASE WHEN end_ns = start_ns THEN 1 ELSE dur END) AS bytes,
           greatest(least(any_value(t1), t0 + (k + 1) * w) - (t0 + k * w), 1) AS window_ns
    FROM x GROUP BY k, t0, w, link_id, link_src, link_dst)
SELECT a.window_index, a.window_start_ns, a.link_id, a.link_type, a.link_src, a.link_dst, a.transfers,
       a.bytes, a.bytes * 1e9 / a.window_ns AS bytes_per_s, tl.bandwidth_Bps,
       a.bytes * 1e9 / a.window_ns / tl.bandwidth_Bps AS bandwidth_fraction
FROM agg a LEFT JOIN (SELECT link_id, max(bandwidth_Bps) AS bandwidth_Bps FROM topology_links
                      GROUP BY link_id) tl USING (link_id)
"""

# Order matters: a macro may only refer to macros created before it.
ALL = (
    OPS,
    TRANSFERS,
    CHIP_BUSY,
    LINK_BUSY,
    SPAN_EXTENT,
    UTILIZATION,
    UTILIZATION_BY_TYPE,
    TOPOLOGY_LINKS,
    LINK_THROUGHPUT,
    LAUNCHES,
)


def install(con: Any) -> None:
    """Create the analysis macros and views on a DuckDB connection that has `spans_raw`
    and `runs` (as `chiptrace.query.connect` makes them)."""
    for sql in ALL:
        con.execute(sql)
