"""Analysis: utilization, critical path and bottleneck rules over the span tables.

Shaped like HTA: the store is parsed once into small tables (`tables.load_tables`: DuckDB
aggregates over the Parquet parts, built on the SQL macros of `chiptrace._macros`), then
stateless functions turn tables into results (`rules_chips`, `rules_roofline`,
`rules_links`, `rules_comm`, `rules_run`, `metrics`, `critical_path`), behind one front
door, `TraceAnalysis`. Nothing here draws: the report and the viewer render the plain
dataclasses this package returns.

A run may hold several workloads, one per step name (`workloads` guesses them, or
`step_name="ProfilerStep#*"` names them): each is analysed on its own steps and the chips
and links it uses, and the findings of all of them are ranked in one list.

Whole run::

    from chiptrace.analysis import TraceAnalysis
    ta = TraceAnalysis("traces/run1")          # or a chiptrace.connect(...) connection
    ta.findings()        # [Finding(rule, severity, culprit, evidence, suggestion, share,
                         #          saving_ns, step)], the worst first over every workload
    ta.metrics()         # {"step": ..., "step_ms_p50": ..., "utilization": {...}, "mfu": ...}
    ta.critical_path()   # CriticalPath of the first workload's slowest step
    ta.utilization(10)   # Arrow table: busy fraction per chip per 10 ms window
    ta.report().to_dict()  # what `chiptrace report --json` prints

Live window (the viewer, each refresh)::

    from chiptrace.analysis import analyze
    findings = analyze(con, since_ns=now - 5_000_000_000, until_ns=now)

`analyze` runs every rule on the spans overlapping [since_ns, until_ns) (clipped to it) and
loads at most `sample_steps` steps span by span, so its cost follows the window, plus one
pass over the store's parent ids to tell leaf spans (a leaf must not depend on the window):
about 2 CPU-seconds for a 1 s window of a 10M-span store (whole-store scans of parent ids
and step roots), far less on a live store of minutes. Findings are frozen dataclasses: compare them with
`Finding.key` (rule, culprit) across refreshes.

Rules (RULES): straggler, load-imbalance, compute-bound / memory-bound (roofline),
precision-opportunity, starvation, link-bound, link-down, latency-bound, pageable-copy,
poor-overlap, exposed-comm, launch-bound, host-bound / data-loading, warm-up,
rank-straggler, step-outliers, long-tasks, queue-overload, dropped-spans, host-contention,
error-rate / tail-latency (docs/sql.md has the table). Steps are per rank, and step rules
apply only where the trace shows training (`per_step.WorkloadTables.training`). Each finding says what fixing it would save per step; severity is high /
medium / low / info, mostly from that saving's share of the step (>= 10% high, >= 3% medium).
"""

from __future__ import annotations

from chiptrace.analysis.critical_path import critical_path
from chiptrace.analysis.diff import diff_reports
from chiptrace.analysis.findings import (
    SEVERITIES,
    CriticalPath,
    Finding,
    PathSegment,
    sort_findings,
)
from chiptrace.analysis.report import Report
from chiptrace.analysis.trace_analysis import RULES, TraceAnalysis, analyze, run_rules
from chiptrace.topology import ChipSpec, LinkSpec, Topology, parse_topology

__all__ = [
    "TraceAnalysis",
    "analyze",
    "run_rules",
    "RULES",
    "Report",
    "Finding",
    "CriticalPath",
    "PathSegment",
    "SEVERITIES",
    "critical_path",
    "sort_findings",
    "diff_reports",
    "Topology",
    "ChipSpec",
    "LinkSpec",
    "parse_topology",
]
