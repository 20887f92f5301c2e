"""The SQL of the Chrome export: which track and process a span goes to, and the flow
arrows between the spans of one file (`chiptrace_file`, placed in `chiptrace_placed`)."""

from __future__ import annotations

# The track of a span, in SQL, and its display name: the chip, else the link, else the
# service (what _track_key orders in Python).
TRACK_SQL = """CASE WHEN coalesce(chip_id, '') <> '' THEN chip_id
     WHEN coalesce(link_id, '') <> '' THEN link_id
     ELSE coalesce(nullif(service, ''), 'spans') END"""
HOST_SQL = "coalesce(nullif(host, ''), 'host')"
# The last nanosecond inside a span (its start when it has no length).
LAST_NS = "greatest({t}.start_ns, {t}.end_ns - 1)"

# Flow arrows: the edges (each span link; each child of a transfer), the two spans of each,
# the earlier one as the source (`fwd`), and the instants the arrow leaves and lands.
FLOWS_SQL = f"""
WITH edges AS (
    SELECT 'parent' AS via, s.trace_id AS ta, s.parent_span_id AS a,
           s.trace_id AS tb, s.span_id AS b
    FROM chiptrace_file s WHERE s.parent_span_id IS NOT NULL
    UNION ALL
    SELECT 'link', coalesce(from_hex(nullif(lk ->> 'trace_id', '')), dt),
           from_hex(lk ->> 'span_id'), dt, ds
    FROM (SELECT s.trace_id AS dt, s.span_id AS ds, unnest(json_extract(s.links, '$[*]')) AS lk
          FROM chiptrace_file s WHERE s.links IS NOT NULL AND json_valid(s.links)
          AND json_type(s.links) = 'ARRAY')
    WHERE regexp_full_match(coalesce(lk ->> 'span_id', ''), '([0-9a-fA-F]{{2}})+')
      AND regexp_full_match(coalesce(lk ->> 'trace_id', ''), '(([0-9a-fA-F]{{2}})+)?')
),
pairs AS (
    SELECT e.ta, e.a, e.tb, e.b,
           x.start_ns AS a0, {LAST_NS.format(t="x")} AS a1,
           y.start_ns AS b0, {LAST_NS.format(t="y")} AS b1
    FROM edges e
    JOIN chiptrace_file x ON x.trace_id = e.ta AND x.span_id = e.a
    JOIN chiptrace_file y ON y.trace_id = e.tb AND y.span_id = e.b
    WHERE (e.ta <> e.tb OR e.a <> e.b)
      AND (e.via = 'link' OR coalesce(x.link_id, '') <> '')
),
directed AS (
    SELECT CASE WHEN fwd THEN ta ELSE tb END AS st, CASE WHEN fwd THEN a ELSE b END AS ss,
           CASE WHEN fwd THEN tb ELSE ta END AS dt, CASE WHEN fwd THEN b ELSE a END AS ds,
           CASE WHEN fwd THEN a0 ELSE b0 END AS s0, CASE WHEN fwd THEN a1 ELSE b1 END AS s1,
           CASE WHEN fwd THEN b0 ELSE a0 END AS d0, CASE WHEN fwd THEN b1 ELSE a1 END AS d1
    FROM (SELECT *, a0 <= b1 AS fwd FROM pairs)
),
timed AS (
    SELECT DISTINCT st, ss, dt, ds, greatest(s0, least(s1, d1)) AS s_ts, d0 FROM directed
)
SELECT sp.pid AS spid, sp.tid AS stid, s_ts,
       dp.pid AS dpid, dp.tid AS dtid, greatest(d0, s_ts) AS d_ts
FROM timed t
JOIN chiptrace_placed sp ON sp.trace_id = t.st AND sp.span_id = t.ss
JOIN chiptrace_placed dp ON dp.trace_id = t.dt AND dp.span_id = t.ds
ORDER BY d_ts, s_ts, dpid, dtid, spid, stid
"""

# A process per host and resource (service, rank, ...): ranks of one job on one host stay
# apart, and an import of the file gives each span its own process's resource back.
PROCESS_SQL = f"{HOST_SQL} AS h, coalesce(service, '') AS svc, coalesce(resource, '') AS res"

TRACKS_SQL = f"""
SELECT {PROCESS_SQL}, {TRACK_SQL} AS track, any_value(chip_id) AS chip_id,
       any_value(chip_type) AS chip_type, any_value(link_id) AS link_id,
       any_value(service) AS service, min(start_ns) AS t0
FROM selected GROUP BY ALL
"""

# Slices in time order (a track's slices come in (start, -end) order, as lanes need), so a
# file cut by size is a window of time over every track.
SLICES_SQL = f"""
SELECT s.*, t.rank AS _rank
FROM (SELECT *, {PROCESS_SQL}, {TRACK_SQL} AS track FROM selected) s
JOIN chiptrace_tracks t USING (h, svc, res, track)
ORDER BY s.start_ns, s.end_ns DESC, t.rank, s.span_id
"""

# The spans of one file: those its slices placed.
FILE_SQL = """
CREATE OR REPLACE TEMP VIEW chiptrace_file AS
SELECT s.* FROM selected s
SEMI JOIN chiptrace_placed p ON p.trace_id = s.trace_id AND p.span_id = s.span_id
"""
