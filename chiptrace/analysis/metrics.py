"""Headline metrics of a run: step time, utilization per chip type, comm share, MFU, drops.

`headline(x)` returns a flat dict of plain numbers (None where the trace cannot tell), the
`metrics` object of `chiptrace report --json`; its keys are listed in METRIC_KEYS.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from chiptrace.analysis.findings import CriticalPath
from chiptrace.analysis.rule_input import RuleInput
from chiptrace.analysis.tables import TraceTables

METRIC_KEYS = (
    "step",
    "spans",
    "spans_dropped",
    "wall_ms",
    "steps",
    "step_ms_p50",
    "step_ms_p99",
    "step_ms_mean",
    "utilization",
    "chips",
    "links",
    "comm_share",
    "critical_path_comm_share",
    "mfu",
    "achieved_tflops",
    "steps_sampled",
)


def percentile(values: Sequence[float], q: float) -> float | None:
    """Linear-interpolated percentile (q in 0..100) of `values`; None when empty."""
    if not values:
        return None
    v = sorted(values)
    pos = (len(v) - 1) * q / 100
    lo = int(pos)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (pos - lo)


def step_durations(t: TraceTables) -> list[int]:
    s = t.steps
    return [
        max(e - b, 0)
        for b, e in zip(
            s.column("start_ns").to_pylist(), s.column("end_ns").to_pylist(), strict=True
        )
    ]


def _mfu(x: RuleInput) -> tuple[float | None, float | None]:
    """Model FLOP utilization: FLOPs done over what the chips' peaks allow in the wall time."""
    t = x.tables
    flops = 0.0
    peak_sum = 0.0
    by_chip: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for r in t.chip_ops.to_pylist():
        if r["flops"]:
            by_chip[r["chip_id"]][r["op_precision"] or "fp32"] += r["flops"]
    total = sum(sum(p.values()) for p in by_chip.values())
    for chip, precs in by_chip.items():
        main = max(precs, key=lambda p: precs[p])  # peak at the precision the chip mostly ran
        peak = t.topology.peak(chip, main)
        if peak:
            flops += sum(precs.values())
            peak_sum += peak
    achieved = total / (t.wall_ns / 1e9) / 1e12 if total else None
    if not peak_sum:
        return None, achieved
    return min(flops / (peak_sum * t.wall_ns / 1e9), 1.0), achieved


# The profiler's names for a collective the host runs (gloo on CPU): comm, whatever kind.
HOST_COLLECTIVE = ("gloo:", "nccl:", "mpi:", "ucc:", "c10d::")


def comm_share(paths: list[CriticalPath]) -> float | None:
    """Share of the sampled steps' critical paths spent in communication."""
    if not paths:
        return None
    shares = []
    for p in paths:
        if p.duration_ns <= 0:
            continue
        comm = sum(
            s.on_path_ns
            for s in p.segments
            if s.link_id or s.op_kind == "comm" or (s.name or "").startswith(HOST_COLLECTIVE)
        )
        shares.append(comm / p.duration_ns)
    return statistics.fmean(shares) if shares else None


def step_figures(x: RuleInput, exposed_comm_share: float | None = None) -> dict[str, Any]:
    """One workload's step figures: steps (every rank's copy of a step counts), ranks,
    step_ms_p50/p99/mean, comm shares, sampled."""
    durs = step_durations(x.tables)
    p50, p99 = percentile(durs, 50), percentile(durs, 99)
    procs = (
        x.tables.steps.column("proc").to_pylist() if "proc" in x.tables.steps.column_names else []
    )
    return {
        "steps": len(durs),
        "ranks": max(len(set(procs)), 1),  # processes (ranks) whose steps these are
        "step_ms_p50": _round(p50 / 1e6 if p50 is not None else None),
        "step_ms_p99": _round(p99 / 1e6 if p99 is not None else None),
        "step_ms_mean": _round(statistics.fmean(durs) / 1e6 if durs else None),
        "comm_share": _round(exposed_comm_share),
        "critical_path_comm_share": _round(comm_share(x.paths)),
        "steps_sampled": len(x.steps),
    }


def headline(x: RuleInput, steps: dict[str, Any]) -> dict[str, Any]:
    """The run's headline figures (METRIC_KEYS): the first workload's step figures
    (`step_figures`) beside the run's spans, utilization, MFU and drops."""
    t = x.tables
    util: dict[str, list[float]] = defaultdict(list)
    count: dict[str, int] = defaultdict(int)
    for r in t.chips.to_pylist():
        util[r["chip_type"]].append(min(r["busy_ns"] / t.wall_ns, 1.0))
        count[r["chip_type"]] += 1
    mfu, tflops = _mfu(x)
    return {
        "step": x.workload,
        "spans": t.spans,
        "spans_dropped": t.spans_dropped,
        "wall_ms": round(t.wall_ns / 1e6, 4),
        "steps": steps["steps"],
        "step_ms_p50": steps["step_ms_p50"],
        "step_ms_p99": steps["step_ms_p99"],
        "step_ms_mean": steps["step_ms_mean"],
        "utilization": {k: round(statistics.fmean(v), 4) for k, v in sorted(util.items())},
        "chips": dict(sorted(count.items())),
        "links": t.links.num_rows,
        "comm_share": steps["comm_share"],
        "critical_path_comm_share": steps["critical_path_comm_share"],
        "mfu": _round(mfu),
        "achieved_tflops": _round(tflops),
        "steps_sampled": steps["steps_sampled"],
    }


def _round(v: float | None) -> float | None:
    return None if v is None else round(v, 4)
