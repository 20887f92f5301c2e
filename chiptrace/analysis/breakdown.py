"""Where the time went, by process, thread and span name: the report's answer for a trace
that is not a GPU training run (a browser's, a service's, PyTorch on the CPU), where step
and device rules have nothing to say.

Self time is a span's duration less the time of its children (clipped to it), so nested
calls are not counted twice and the rows add up to the traced time per thread. The PyTorch
profiler's own range (`PyTorch Profiler (0)`, Kineto's `Trace`) is left out: its self time
is everything the profiler did not record.
"""

from __future__ import annotations

from typing import Any

from chiptrace.analysis.rule_input import ms

MAX_ROWS = 15

_SQL = """
WITH s AS (
    SELECT trace_id, span_id, parent_span_id, CAST(name AS VARCHAR) AS name,
           coalesce('rank ' || json_extract_string(resource, '$."distributed.rank"'),
                    CAST(service AS VARCHAR) || ' pid ' || pid, CAST(service AS VARCHAR),
                    'pid ' || pid, '-') AS process,
           coalesce(json_extract_string(attributes, '$."thread.id"'), '-') AS thread,
           greatest(start_ns, {lo}) AS s, least(end_ns, {hi}) AS e
    FROM spans_raw
    WHERE link_id IS NULL AND coalesce(CAST(chip_type AS VARCHAR), '') NOT IN ('gpu', 'npu')
      AND NOT coalesce(contains(attributes, '"kineto.cat":"Trace"'), false)
      AND end_ns > start_ns AND end_ns >= {lo} AND start_ns < {hi}),
kids AS (
    SELECT c.trace_id, c.parent_span_id AS id,
           sum(least(c.e, p.e) - greatest(c.s, p.s)) AS child
    FROM s c JOIN s p ON p.span_id = c.parent_span_id AND p.trace_id = c.trace_id
    WHERE least(c.e, p.e) > greatest(c.s, p.s)
    GROUP BY 1, 2)
SELECT process, thread, name, count(*) AS n, CAST(sum(e - s) AS DOUBLE) AS total,
       CAST(sum(greatest(e - s - coalesce(k.child, 0), 0)) AS DOUBLE) AS self
FROM s LEFT JOIN kids k ON k.id = s.span_id AND k.trace_id = s.trace_id
GROUP BY ALL ORDER BY self DESC, process, thread, name"""


def time_breakdown(con: Any, lo: int, hi: int, limit: int = MAX_ROWS) -> list[dict[str, Any]]:
    """The spans off GPUs/NPUs and links, by process, thread and name: count, total and
    self time (ms) and the share of all self time; the `limit` largest by self time.

    Args:
        con: a `chiptrace.connect()` connection.
        lo, hi: the analysed range (Unix ns); spans are clipped to it.
    """
    rows = con.sql(_SQL.format(lo=int(lo), hi=int(hi))).fetchall()
    total_self = sum(r[5] for r in rows) or 1.0
    return [
        {
            "process": process,
            "thread": thread,
            "name": name,
            "count": n,
            "total_ms": ms(total),
            "self_ms": ms(self_ns),
            "self_share": round(self_ns / total_self, 4),
        }
        for process, thread, name, n, total, self_ns in rows[:limit]
    ]
