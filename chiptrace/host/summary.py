"""What a recorded run looked like, in a few figures: SQL over the spans and metrics views.

Pure queries returning plain data; `chiptrace record` renders them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class GpuFigures:
    """Means and peaks of one GPU over the run."""

    chip_id: str
    name: str | None
    util: float | None
    mem_used_max: float | None
    power: float | None


@dataclass
class RunSummary:
    """The figures `chiptrace record` prints.

    Attributes:
        spans_by_chip_type: chip type (or '-' for untagged spans) -> span count.
        cpu_util: mean utilization over all logical CPUs and samples (percent).
        cpus: logical CPUs sampled.
        top_nic: (interface, chip id, bytes received, bytes sent) of the busiest interface.
        gpus: one entry per GPU NVML reported.
        samples: metric rows in the window.
        program: (mean cores, peak cores, CPU seconds, peak RSS bytes) of the watched
            process tree (`HostSampler.watch_process`), if there was one.
    """

    spans_by_chip_type: dict[str, int] = field(default_factory=dict)
    cpu_util: float | None = None
    cpus: int = 0
    top_nic: tuple[str, str, float, float] | None = None
    gpus: list[GpuFigures] = field(default_factory=list)
    samples: int = 0
    program: tuple[float, float, float, float] | None = None

    @property
    def spans(self) -> int:
        return sum(self.spans_by_chip_type.values())


def _rows(con: Any, sql: str, params: list[Any]) -> list[tuple]:
    return con.execute(sql, params).fetchall()


def summarize(con: Any, since_ns: int = 0, until_ns: int | None = None) -> RunSummary:
    """Summarize the spans and host metrics between two Unix-ns instants.

    Args:
        con: a connection from `chiptrace.connect` (views `spans` and `metrics`).
        since_ns: ignore spans that started and samples taken before this.
        until_ns: ignore those after this (default: no bound).
    """
    until = until_ns if until_ns is not None else 2**63 - 1
    window = [since_ns, until]
    out = RunSummary()
    for chip_type, n in _rows(
        con,
        "SELECT coalesce(chip_type, '-'), count(*) FROM spans "
        "WHERE start_ns BETWEEN ? AND ? GROUP BY 1 ORDER BY 2 DESC, 1",
        window,
    ):
        out.spans_by_chip_type[chip_type] = n
    m = "FROM metrics WHERE ts_ns BETWEEN ? AND ?"
    out.samples = _rows(con, f"SELECT count(*) {m}", window)[0][0]
    out.cpu_util, out.cpus = _rows(
        con, f"SELECT avg(value), count(DISTINCT chip_id) {m} AND metric = 'cpu.util'", window
    )[0]
    nic = _rows(
        con,
        "SELECT device, chip_id, "
        "coalesce(sum(value) FILTER (WHERE metric = 'nic.rx_bytes'), 0) AS rx, "
        "coalesce(sum(value) FILTER (WHERE metric = 'nic.tx_bytes'), 0) AS tx "
        f"{m} AND chip_type = 'nic' GROUP BY ALL ORDER BY rx + tx DESC, device LIMIT 1",
        window,
    )
    out.top_nic = tuple(nic[0]) if nic else None
    prog = _rows(
        con,
        "SELECT avg(value) FILTER (WHERE metric = 'proc.cpu') / 100, "
        "max(value) FILTER (WHERE metric = 'proc.cpu') / 100, "
        "sum(value) FILTER (WHERE metric = 'proc.cpu_seconds'), "
        f"max(value) FILTER (WHERE metric = 'proc.rss') {m} AND metric LIKE 'proc.%'",
        window,
    )[0]
    out.program = tuple(prog) if prog[0] is not None else None
    for row in _rows(
        con,
        "SELECT chip_id, any_value(device), "
        "avg(value) FILTER (WHERE metric = 'gpu.util'), "
        "max(value) FILTER (WHERE metric = 'gpu.mem_used'), "
        "avg(value) FILTER (WHERE metric = 'gpu.power') "
        f"{m} AND chip_type = 'gpu' GROUP BY chip_id ORDER BY chip_id",
        window,
    ):
        out.gpus.append(GpuFigures(*row))
    return out


# Mean and peak of every utilization-like series per real chip: the rows a report or the
# viewer puts beside the emulated chips' span-derived utilization.
CHIP_UTILIZATION = """
SELECT host, chip_id, any_value(chip_type) AS chip_type, any_value(device) AS device,
       any_value(source) AS source, metric,
       avg(value) AS mean, max(value) AS peak, count(*) AS samples,
       min(ts_ns) AS first_ns, max(ts_ns) AS last_ns
FROM metrics
WHERE chip_id IS NOT NULL AND metric IN ('cpu.util', 'gpu.util', 'gpu.mem_util')
  AND ts_ns BETWEEN ? AND ?
GROUP BY host, chip_id, metric
ORDER BY host, chip_type, chip_id, metric
"""


def chip_utilization(con: Any, since_ns: int = 0, until_ns: int | None = None) -> Any:
    """Per real chip and utilization metric: mean and peak percent, sample count.

    Args:
        con: a connection from `chiptrace.connect`.
        since_ns, until_ns: the time window (Unix ns); default all samples.

    Returns:
        An Arrow table: host, chip_id, chip_type, device, source ('real'), metric
        (cpu.util, gpu.util, gpu.mem_util), mean, peak, samples, first_ns, last_ns.
    """
    until = until_ns if until_ns is not None else 2**63 - 1
    return con.sql(CHIP_UTILIZATION, params=[since_ns, until]).to_arrow_table()


# Measured utilization in the shape of the span-derived `utilization(window_ms)` macro
# (window, window_start_ns, chip_id, chip_type, utilization as a 0-1 fraction), so a report
# or the viewer can UNION the real chips under the emulated ones.
HOST_UTILIZATION = """
WITH t AS (SELECT coalesce(CAST(? AS BIGINT), min(ts_ns)) AS t0,
                  greatest(CAST(? * 1e6 AS BIGINT), 1) AS w FROM metrics)
SELECT (m.ts_ns - t.t0) // t.w AS "window", t.t0 + (m.ts_ns - t.t0) // t.w * t.w AS window_start_ns,
       m.chip_id, any_value(m.chip_type) AS chip_type, avg(m.value) / 100 AS utilization,
       any_value(m.source) AS source, m.host
FROM metrics m, t
WHERE m.metric IN ('cpu.util', 'gpu.util') AND m.chip_id IS NOT NULL AND m.ts_ns >= t.t0
GROUP BY ALL ORDER BY "window", m.host, m.chip_id
"""


def host_utilization(con: Any, window_ms: float, t0_ns: int | None = None) -> Any:
    """Measured CPU and GPU utilization per chip and time window.

    Args:
        con: a connection from `chiptrace.connect`.
        window_ms: window length in milliseconds.
        t0_ns: start of window 0 (Unix ns); pass the span extent's start to line the
            windows up with `utilization(window_ms)`. Default: the first sample.

    Returns:
        An Arrow table: window, window_start_ns, chip_id, chip_type, utilization (0-1),
        source ('real'), host.
    """
    return con.sql(HOST_UTILIZATION, params=[t0_ns, window_ms]).to_arrow_table()
