"""Per-rank GPU time breakdown, defined as HolisticTraceAnalysis 0.5.0 defines it.

`metrics.ranks` of `chiptrace report --json`: for each rank, the share of the device's
active span (first device event's start to the last one's end) that the GPU was idle,
running compute kernels, or doing anything else (copies, memsets, collectives, syncs), and
the share of communication kernel time overlapped by compute kernels. HTA's definitions,
step by step, so the two agree on the same file:

- device events: spans on a gpu/npu chip whose `stream` attribute is an integer other
  than -1 (kernels, memcpy, memset, syncs with a stream, MTIA device events);
- times in whole microseconds, start rounded up and end down (HTA's ns-rounding);
- when the traces hold two or more `ProfilerStep` names, only device events launched
  (span link to the runtime call) before the start of the rank's last profiler step count
  (HTA drops the last, usually incomplete, step and kernels it cannot tie to a launch);
- kernel type from the name: `^nccl.*Kernel` communication; `^(Memcpy|Memset|dma)` memory;
  names matching `^(nccl.*Kernel|.*Memcpy|Memset|.*Sync)` other; the rest computation;
- intervals merged HTA's way (a new group starts where a start passes every earlier end);
  idle = span - merged busy; compute = merged compute; non-compute = the rest;
- overlap = time both merged compute and merged communication run / merged communication
  (null where a rank has no communication kernel).

The rank is the resource's `distributed.rank` (the importers set it from Kineto's
`distributedInfo`), 0 when absent, as HTA defaults it.
"""

from __future__ import annotations

from typing import Any

# The device events HTA keeps, one row each: rank, chip, name, stream, category, the span
# link to the launching call, times in HTA's whole us (`ts` start, `e` end). Shared by the
# launch-queue figures (analysis/launch.py), which HTA computes over the same events.
KEPT_SQL = r"""
WITH dev AS (
    SELECT coalesce(TRY_CAST(json_extract_string(resource, '$."distributed.rank"') AS BIGINT), 0)
             AS rank,
           CAST(chip_id AS VARCHAR) AS chip_id, CAST(name AS VARCHAR) AS name, links,
           TRY_CAST(trim(json_extract_string(attributes, '$.stream')) AS BIGINT) AS stream,
           json_extract_string(attributes, '$."kineto.cat"') AS cat,
           TRY(from_hex(json_extract_string(links, '$[0].span_id'))) AS launch_id,
           (start_ns + 999) // 1000 AS ts, end_ns // 1000 AS e
    FROM spans_raw
    WHERE chip_type IN ('gpu', 'npu') AND attributes IS NOT NULL
      AND regexp_full_match(coalesce(json_extract_string(attributes, '$.stream'), ''), '\s*[-+]?[0-9]+\s*')
      AND TRY_CAST(trim(json_extract_string(attributes, '$.stream')) AS BIGINT) <> -1
      {range}
),
steps AS (
    SELECT coalesce(TRY_CAST(json_extract_string(resource, '$."distributed.rank"') AS BIGINT), 0)
             AS rank,
           (start_ns + 999) // 1000 AS ts, CAST(name AS VARCHAR) AS name
    FROM spans_raw
    WHERE {step_where}
),
filtering AS ({filtering}),
last_step AS (SELECT rank, max(ts) AS ts FROM steps GROUP BY rank),
launch AS (
    SELECT span_id, CAST(name AS VARCHAR) AS name, (start_ns + 999) // 1000 AS ts,
           end_ns // 1000 AS e
    FROM spans_raw WHERE op_kind = 'launch'
),
kept AS (
    SELECT d.* FROM dev d, filtering f
    WHERE NOT f.on OR EXISTS (
        SELECT 1 FROM launch l JOIN last_step s ON s.rank = d.rank
        WHERE l.span_id = d.launch_id AND l.ts < s.ts)
)"""

RANKS_SQL = (
    KEPT_SQL
    + r""",
typed AS (
    SELECT rank, ts, e,
           CASE WHEN regexp_matches(name, '^nccl.*Kernel') THEN 'comm'
                WHEN regexp_matches(name, '^(Memcpy|Memset|dma)') THEN 'memory'
                WHEN regexp_matches(name, '^(nccl.*Kernel|.*Memcpy|Memset|.*Sync)') THEN 'other'
                ELSE 'compute' END AS ktype
    FROM kept
),
sets AS (
    SELECT rank, 'all' AS grp, ts, e FROM typed
    UNION ALL SELECT rank, 'compute', ts, e FROM typed WHERE ktype = 'compute'
    UNION ALL SELECT rank, 'comm', ts, e FROM typed WHERE ktype = 'comm'
    UNION ALL SELECT rank, 'both', ts, e FROM typed WHERE ktype IN ('comm', 'compute')
),
marked AS (
    SELECT *, CASE WHEN ts > max(e) OVER w THEN 1 ELSE 0 END AS brk FROM sets
    WINDOW w AS (PARTITION BY rank, grp ORDER BY ts, e
                 ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING)
),
grouped AS (
    SELECT *, sum(brk) OVER (PARTITION BY rank, grp ORDER BY ts, e ROWS UNBOUNDED PRECEDING)
             AS gid
    FROM marked
),
merged AS (SELECT rank, grp, gid, min(ts) AS ts, max(e) AS e FROM grouped GROUP BY ALL)
SELECT rank, grp, sum(e - ts) AS len, min(ts) AS first_ts, arg_max(e, ts) AS last_e,
       count(*) AS groups
FROM merged GROUP BY ALL ORDER BY rank, grp
"""
)


# HTA's last-step filter is on when the run has two or more step names. A distributed
# report's per-rank task sees one rank: it passes the whole run's answer (`filtering`).
_FILTERING = "SELECT count(DISTINCT name) >= 2 AS on FROM steps"
_STEP_WHERE = "CAST(name AS VARCHAR) LIKE '%ProfilerStep%' AND coalesce(chip_type, 'cpu') = 'cpu'"
STEP_NAMES_SQL = f"SELECT DISTINCT CAST(name AS VARCHAR) FROM spans_raw WHERE {_STEP_WHERE}"


def kept_sql(
    sql: str, since_ns: int | None, until_ns: int | None, filtering: bool | None = None
) -> str:
    """`sql` (built on KEPT_SQL) with its device events limited to a Unix-ns range;
    `filtering` forces HTA's last-step filter on or off (default: decided from the data)."""
    on = _FILTERING if filtering is None else f"SELECT {bool(filtering)} AS on"
    sql = sql.replace("{filtering}", on).replace("{step_where}", _STEP_WHERE)
    cond = ""
    if since_ns is not None:
        cond += f" AND end_ns > {int(since_ns)}"
    if until_ns is not None:
        cond += f" AND start_ns < {int(until_ns)}"
    return sql.replace("{range}", cond)


def _pct(part: float, whole: float) -> float | None:
    return round(100.0 * part / whole, 2) if whole else None


def rank_breakdown(
    con: Any,
    since_ns: int | None = None,
    until_ns: int | None = None,
    filtering: bool | None = None,
) -> list[dict[str, Any]]:
    """One dict per rank: rank, gpu_idle_pct, gpu_compute_pct, gpu_non_compute_pct,
    comm_compute_overlap_pct (see the module docstring); [] for a run without device
    events that carry a stream (anything but an imported accelerator trace).

    Args:
        con: a `chiptrace.connect()` connection (it has `spans_raw`).
        since_ns, until_ns: only device events inside this Unix-ns range.
    """
    rows = con.execute(kept_sql(RANKS_SQL, since_ns, until_ns, filtering)).fetchall()
    by_rank: dict[int, dict[str, tuple[int, int, int]]] = {}
    for rank, grp, length, first, last, _ in rows:
        by_rank.setdefault(int(rank), {})[grp] = (int(length), int(first), int(last))
    out = []
    for rank in sorted(by_rank):
        g = by_rank[rank]
        busy, first, last = g["all"]
        span = last - first
        idle = span - busy
        compute = g.get("compute", (0, 0, 0))[0]
        comm = g.get("comm", (0, 0, 0))[0]
        both = g.get("both", (0, 0, 0))[0]
        out.append(
            {
                "rank": rank,
                "gpu_idle_pct": _pct(idle, span),
                "gpu_compute_pct": _pct(compute, span),
                "gpu_non_compute_pct": _pct(span - compute - idle, span),
                "comm_compute_overlap_pct": _pct(compute + comm - both, comm) if comm else None,
            }
        )
    return out
