"""The launch queue per rank and GPU stream, defined as HolisticTraceAnalysis 0.5.0 defines
its queue length and idle time breakdown, so the two agree on the same file.

`launch` of `chiptrace report --json`: one row per (rank, stream) with launched work:

- queue length: the work a stream has been given but not started. It rises at the start of
  each launching runtime call (`cudaLaunchKernel`, `cudaMemcpyAsync`, `cudaMemsetAsync`, their
  HIP and MTIA names) and falls at the start of the work it launched; `queue_length_mean` and
  `queue_length_max` are taken over those changes (HTA's `get_queue_length_summary`, not a
  time average). A queue near 0 means the GPU consumes work as fast as the host makes it;
- idle time between consecutive kernels, copies and memsets on the stream, by cause (HTA's
  `get_idle_time_breakdown`): `host_wait` when the next one's runtime call started after the
  previous one ended (the host had not launched it yet), else `kernel_wait` for gaps under
  30 us (back-to-back launch overhead), else `other` (waiting on an event, another stream);
- `launch_delay_us_p50`: median of device start minus the launching call's end.

Over the device events `ranks.KEPT_SQL` keeps (HTA drops the last profiler step's), times in
HTA's whole microseconds.
"""

from __future__ import annotations

from typing import Any

from chiptrace.analysis.ranks import KEPT_SQL, kept_sql

#: Runtime calls that queue device work (HTA's `get_runtime_launch_events_query`).
LAUNCH_CALLS = (
    "cudaLaunchKernel",
    "cudaLaunchKernelExC",
    "cuLaunchKernel",
    "cudaMemcpyAsync",
    "cudaMemsetAsync",
    "runFunction - job_prep_and_submit_for_execution",
    "hipLaunchKernel",
    "hipExtModuleLaunchKernel",
    "hipMemsetAsync",
    "hipMemcpyAsync",
    "hipMemcpyWithStream",
)
KERNEL_WAIT_US = 30  # HTA's consecutive_kernel_delay
_WORK_CATS = ("kernel", "Kernel", "gpu_memset", "Memset", "gpu_memcpy", "Memcpy", "mtia_ccp_events")

LAUNCH_SQL = (
    KEPT_SQL
    + """,
pairs AS (
    SELECT k.rank, k.chip_id, k.stream, k.ts AS kts, l.ts AS lts, l.e AS le
    FROM kept k JOIN launch l ON l.span_id = k.launch_id
    WHERE l.name IN ({calls})),
ev AS (SELECT rank, stream, lts AS t, 1 AS q, 0 AS o FROM pairs
       UNION ALL SELECT rank, stream, kts, -1, 1 FROM pairs),
ql AS (SELECT rank, stream, sum(q) OVER (PARTITION BY rank, stream ORDER BY t, o, q
                                         ROWS UNBOUNDED PRECEDING) AS len FROM ev),
queue AS (SELECT rank, stream, count(*) // 2 AS launches, avg(len) AS mean, max(len) AS mx
          FROM ql GROUP BY ALL),
delay AS (SELECT rank, stream, any_value(chip_id) AS chip_id, median(kts - le) AS d
          FROM pairs GROUP BY ALL),
work AS (
    SELECT k.rank, k.stream, k.ts, l.ts AS lts,
           k.ts - lag(k.e) OVER (PARTITION BY k.rank, k.stream ORDER BY k.ts) AS idle,
           lag(k.e) OVER (PARTITION BY k.rank, k.stream ORDER BY k.ts) AS prev_e
    FROM kept k LEFT JOIN launch l ON l.span_id = k.launch_id
    WHERE k.cat IN ({cats})),
idle AS (
    SELECT rank, stream,
           sum(idle) FILTER (WHERE lts > prev_e) AS host,
           sum(idle) FILTER (WHERE NOT coalesce(lts > prev_e, false) AND idle < {kw}) AS kern,
           sum(idle) FILTER (WHERE NOT coalesce(lts > prev_e, false) AND idle >= {kw}) AS other
    FROM work GROUP BY ALL)
SELECT coalesce(q.rank, i.rank) AS rank, coalesce(q.stream, i.stream) AS stream, d.chip_id,
       q.launches, q.mean, q.mx, i.host, i.kern, i.other, d.d
FROM queue q FULL JOIN idle i ON i.rank = q.rank AND i.stream = q.stream
LEFT JOIN delay d ON d.rank = coalesce(q.rank, i.rank) AND d.stream = coalesce(q.stream, i.stream)
ORDER BY 1, 2
"""
)


def _list(names: tuple[str, ...]) -> str:
    return ", ".join("'" + n.replace("'", "''") + "'" for n in names)


def launch_queue(
    con: Any,
    since_ns: int | None = None,
    until_ns: int | None = None,
    filtering: bool | None = None,
) -> list[dict[str, Any]]:
    """One dict per (rank, stream) with launched work: rank, stream, chip_id, launches,
    queue_length_mean, queue_length_max, host_wait_ms, kernel_wait_ms, other_wait_ms,
    launch_delay_us_p50 (see the module docstring); [] for a trace without launches.

    Args:
        con: a `chiptrace.connect()` connection.
        since_ns, until_ns: only device events inside this Unix-ns range.
    """
    sql = kept_sql(LAUNCH_SQL, since_ns, until_ns, filtering).format(
        calls=_list(LAUNCH_CALLS), cats=_list(_WORK_CATS), kw=KERNEL_WAIT_US
    )
    out = []
    for rank, stream, chip, n, mean, mx, host, kern, other, delay in con.execute(sql).fetchall():
        out.append(
            {
                "rank": int(rank),
                "stream": int(stream),
                "chip_id": chip,
                "launches": int(n or 0),
                "queue_length_mean": None if mean is None else round(float(mean), 4),
                "queue_length_max": None if mx is None else int(mx),
                "host_wait_ms": round((host or 0) / 1e3, 3),
                "kernel_wait_ms": round((kern or 0) / 1e3, 3),
                "other_wait_ms": round((other or 0) / 1e3, 3),
                "launch_delay_us_p50": None if delay is None else round(float(delay), 1),
            }
        )
    return out
