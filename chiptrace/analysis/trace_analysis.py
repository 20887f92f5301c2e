"""The front door: `TraceAnalysis` over a trace dir, and `analyze()` for a live window."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Sequence
from functools import cached_property
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from chiptrace.analysis import metrics as _metrics
from chiptrace.analysis import rules_chips as rc
from chiptrace.analysis import rules_comm as rm
from chiptrace.analysis import rules_device as rd
from chiptrace.analysis import rules_host as rh
from chiptrace.analysis import rules_links as rl
from chiptrace.analysis import rules_queue as rq
from chiptrace.analysis import rules_roofline as rr
from chiptrace.analysis import rules_run as rn
from chiptrace.analysis.breakdown import time_breakdown
from chiptrace.analysis.critical_path import critical_path
from chiptrace.analysis.errors import AnalysisError
from chiptrace.analysis.findings import CriticalPath, Finding, sort_findings
from chiptrace.analysis.kernels import kernel_breakdown
from chiptrace.analysis.ranking import below_resolution, replay_savings
from chiptrace.analysis.report import Report, chip_rows, link_rows, path_dict, utilization_series
from chiptrace.analysis.rule_input import RuleInput
from chiptrace.analysis.scan_stages import store_tables
from chiptrace.analysis.stages import InProcess, Runner, Stages, rank_figures, sampled_steps
from chiptrace.analysis.steps import Step, load_steps, pick_steps, step_groups, whole_trace
from chiptrace.analysis.tables import COMPUTE_TYPES, TraceTables

Rule = Callable[[RuleInput], list[Finding]]


def _service(x: RuleInput) -> list[Finding]:
    t = x.tables
    table = x.endpoints
    if table is None and x.con is None:
        return []
    if table is None:
        table = rn.endpoints(x.con, t.lo, t.hi, f"end_ns >= {t.lo} AND start_ns < {t.hi}")
    return rn.service(x, table)


#: Every rule by id, in the order they run (compute-bound also yields memory-bound,
#: error-rate also tail-latency, host-bound also data-loading findings).
RULES: dict[str, Rule] = {
    "straggler": rc.straggler,
    "load-imbalance": rc.load_imbalance,
    "compute-bound": rr.roofline,
    "precision-opportunity": rr.precision_opportunity,
    "starvation": rc.starvation,
    "link-bound": rl.link_bound,
    "link-down": rl.link_down,
    "latency-bound": rm.latency_bound,
    "pageable-copy": rl.pageable_copies,
    "poor-overlap": rm.poor_overlap,
    "exposed-comm": rd.exposed_comm,
    "launch-bound": rd.launch_bound,
    "host-bound": rh.host_bound,
    "warm-up": rh.warm_up,
    "rank-straggler": rd.rank_straggler,
    "step-outliers": rn.step_outliers,
    "long-tasks": rn.long_tasks,
    "queue-overload": rq.queue_overload,
    "dropped-spans": rm.dropped_spans,
    "host-contention": rn.host_contention,
    "error-rate": _service,
}
#: Rules about the whole run, run once (with the first workload's step for their shares).
RUN_RULES = ("dropped-spans", "host-contention", "error-rate", "long-tasks")

# DuckDB's share of the report's memory: past it, aggregates and joins spill to disk; the
# rest (NumPy chunks of intervals.py, Arrow tables) stays under ~1 GiB on 100M spans.
MEMORY_LIMIT = "2GB"
SAMPLE_SPANS = 150_000  # spans analysed one by one (critical path, overlap, starvation)
# A step bigger than this is not walked span by span (Python, ~10 us a span): an nvl72 step
# has ~2M spans. Its critical path, overlap and starvation are then left out, and said so.
MAX_STEP_SPANS = 400_000


def run_rules(x: RuleInput, rules: Iterable[str] | None = None) -> list[Finding]:
    """Run the named rules (default: all) on one workload, most severe first."""
    found: list[Finding] = []
    stragglers: set[str] = set()
    for name in list(rules) if rules is not None else list(RULES):
        if name == "load-imbalance":
            found += rc.load_imbalance(x, skip=stragglers)
            continue
        out = RULES[name](x)
        if name == "straggler":
            stragglers = {f.culprit for f in out}
        found += out
    # A GPU idle while its host launches is one finding, not two: launch-bound names the
    # launch queue, starvation only that the host was busy meanwhile.
    if any(f.rule in ("launch-bound", "host-bound", "data-loading") for f in found):
        found = [f for f in found if f.rule != "starvation"]
    # A late rank is one finding: rank-straggler says whom it keeps waiting, and how long.
    late = {f.culprit for f in found if f.rule == "rank-straggler"}
    found = [f for f in found if not (f.rule == "straggler" and f.culprit in late)]
    # A serving queue that grows is the cause of its slow requests: one finding.
    if any(f.rule == "queue-overload" for f in found):
        found = [f for f in found if f.rule != "step-outliers"]
    return sort_findings(found)


class TraceAnalysis:
    """Analyse one run: utilization, critical path, bottleneck findings, headline metrics.

    A run may hold several workloads (mixed: `train_step` and `request`): each is analysed
    on its own steps, and `findings()` ranks them all in one list.

    Args:
        source: trace dir(s) / glob(s), or a connection from `chiptrace.connect`.
        since_ns, until_ns: analyse only this time range (Unix ns).
        step_name: a glob of the span names that mark a step (`'ProfilerStep#*'`); default
            guessed (chiptrace.analysis.workloads says how).
        sample_steps: how many steps of each workload get span-level analysis (critical
            path, overlap, starvation): the slowest, the median, and some spread over the run.
        windows: points in the utilization-over-time series.
        max_step_spans: steps with more spans than this (on average) get no span-level
            analysis (critical path, overlap, starvation): it runs in Python.
        runner: where the per-step and per-rank stages run (analysis/stages.py): here
            (default), or as tasks on a Dask cluster (chiptrace.cluster).

    Example:
        >>> ta = TraceAnalysis("traces/run1")
        >>> for f in ta.findings(): print(f.severity, f.rule, f.culprit, f.suggestion)
    """

    def __init__(
        self,
        source: str | os.PathLike[str] | Sequence[str | os.PathLike[str]] | Any,
        *,
        since_ns: int | None = None,
        until_ns: int | None = None,
        step_name: str | None = None,
        sample_steps: int = 5,
        windows: int = 120,
        max_step_spans: int = MAX_STEP_SPANS,
        runner: Runner | None = None,
    ) -> None:
        if hasattr(source, "sql") and hasattr(source, "execute"):
            self.con = source
            self.sources: list[str] = []
        else:
            from chiptrace._runs import refuse_overlapping_runs
            from chiptrace.query import connect

            refuse_overlapping_runs([source] if isinstance(source, (str, os.PathLike)) else source)

            # verify: the analysis reads every span anyway; a part with a page that does not
            # decode, NULL times or JSON that is not JSON is skipped (named), not a crash.
            self.con = connect(source, memory_limit=MEMORY_LIMIT, verify=True)
            paths = [source] if isinstance(source, (str, os.PathLike)) else list(source)
            self.sources = [os.fspath(p) for p in paths]
        self.since_ns, self.until_ns = since_ns, until_ns
        self.step_name, self.sample_steps, self.windows = step_name, sample_steps, windows
        self.max_step_spans = max_step_spans
        self.runner: Runner = runner if runner is not None else InProcess()
        if self.runner.remote and not self.sources:
            raise AnalysisError(
                "stages on a cluster read the store: give its paths, not a connection"
            )

    @cached_property
    def tables(self) -> TraceTables:
        """The run reduced to per-chip, per-link, per-step tables (computed once; on a
        cluster as stages: analysis/scan_stages.py)."""
        return store_tables(
            self.runner,
            self.con,
            self.sources,
            self.since_ns,
            self.until_ns,
            windows=self.windows,
            step_name=self.step_name,
        )

    def _sample(self, t: TraceTables, budget: float) -> tuple[list[Step], list[CriticalPath]]:
        # Span-level work is Python: keep it to about `budget` spans for this workload.
        per_step = t.spans / max(sum(w.steps.num_rows for w in t.workloads), 1)
        if per_step > self.max_step_spans:
            return [], []
        # A step is every rank's copy of it (steps.step_groups): k steps cost k x ranks.
        ranks = t.steps.num_rows / max(len(step_groups(t.steps)), 1)
        k = max(1, min(self.sample_steps, int(budget // max(per_step * ranks, 1))))
        rows = pick_steps(t.steps, k if self.sample_steps else 0)
        return sampled_steps(self.runner, self.con, t.steps, rows)

    @cached_property
    def _rank_figures(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """`metrics.ranks` and the launch queue (analysis/stages.py: per rank on a cluster)."""
        return rank_figures(self.runner, self.con, self.sources, self.since_ns, self.until_ns)

    @cached_property
    def inputs(self) -> list[RuleInput]:
        """One RuleInput per workload (busiest first); a run without steps gets one whole."""
        t = self.tables
        owner_chip: dict[str, int] = {}
        owner_link: dict[str, int] = {}
        for i, w in enumerate(t.workloads):
            for c in w.chips:
                owner_chip.setdefault(c, i)
            for lk in w.links:
                owner_link.setdefault(lk, i)
        all_chips = set(t.chips.column("chip_id").to_pylist())
        all_links = set(t.links.column("link_id").to_pylist())
        out = []
        budget = SAMPLE_SPANS / max(len(t.workloads), 1)
        for i, w in enumerate(t.workloads):
            tw = t.for_workload(w)
            # Tasks that are not training steps (a browser's, a service's) get no step
            # analysis: no critical path of a "step", shares of the wall time.
            steps, paths = self._sample(tw, budget) if w.training else ([], [])
            durs = _metrics.step_durations(tw)
            chips = {c for c in all_chips if owner_chip.get(c, 0) == i}
            links = {lk for lk in all_links if owner_link.get(lk, 0) == i}
            out.append(
                RuleInput(
                    tw,
                    steps,
                    paths,
                    float(_metrics.percentile(durs, 50) or 0.0) if w.training else 0.0,
                    w.name,
                    frozenset(chips),
                    frozenset(links),
                    self.con,
                    training=w.training,
                    stages=self._stages,
                )
            )
        return out or [self._whole(t)]

    def _whole(self, t: TraceTables) -> RuleInput:
        """A run without steps: one input over the whole range; where it holds launched
        device work (an inference call, a benchmark) and is small enough to walk, that
        range is its one sampled step, so the device rules (launch-bound...) see it."""
        tw = t.for_workload(None)
        launched = any(r["op_kind"] == "launch" for r in t.chip_ops.to_pylist())
        if not launched or not self.sample_steps or t.spans > SAMPLE_SPANS:
            return RuleInput(tw, con=self.con, stages=self._stages)
        whole = whole_trace(self.con, t.lo, t.hi)
        # shares are of the work's extent: a profiler's range around it is not the step
        return RuleInput(
            tw, [whole], [], float(whole.duration_ns), con=self.con, stages=self._stages
        )

    @cached_property
    def _stages(self) -> Stages:
        """The per-step stages' runner and what they read (this connection, or paths)."""
        return Stages(self.runner, self.con, self.sources)

    @cached_property
    def endpoints(self) -> list[dict[str, Any]]:
        """Per endpoint (server spans, else root spans): requests, errors, latency (ms)."""
        t = self.tables
        if not t.spans:
            return []
        return rn.endpoints(self.con, t.lo, t.hi, f"end_ns >= {t.lo} AND start_ns < {t.hi}")

    @property
    def steps(self) -> list[Step]:
        """The first workload's sampled steps, span by span (slowest first, then the median)."""
        return self.inputs[0].steps

    @property
    def critical_paths(self) -> list[CriticalPath]:
        """Critical path of each sampled step of the first workload (slowest first)."""
        return self.inputs[0].paths

    def critical_path(self, trace_id: str | None = None) -> CriticalPath | None:
        """Critical path of one step (hex trace id), default the first workload's slowest;
        None if no steps."""
        if trace_id is None:
            return self.critical_paths[0] if self.critical_paths else None
        for x in self.inputs:
            for s, p in zip(x.steps, x.paths, strict=True):
                if s.trace_id == trace_id:
                    return p
        for x in self.inputs:
            rows = x.tables.steps.filter(pc.equal(x.tables.steps["trace_id"], trace_id))
            steps = load_steps(self.con, rows, [0] if rows.num_rows else [])
            if steps:
                return critical_path(steps[0].spans, steps[0].root_id)
        return None

    @property
    def rule_input(self) -> RuleInput:
        """The first workload's rule input."""
        return self.inputs[0]

    def findings(self, rules: Iterable[str] | None = None) -> list[Finding]:
        """Findings over every workload in the report's order (model.sort_findings): faults,
        bottlenecks, then opportunities, info last; most severe first within each."""
        names = list(rules) if rules is not None else list(RULES)
        per_workload = [n for n in names if n not in RUN_RULES]
        out: list[Finding] = []
        for x in self.inputs:
            # Each finding priced by replaying the steps with its culprit fixed (ranking.py).
            # A chosen subset of rules gets no sweep (sweep.py): only what was asked for.
            found = replay_savings(x, run_rules(x, per_workload), sweep=rules is None)
            out += below_resolution(x, found)
        first = self.inputs[0]
        first.endpoints = self.endpoints
        for n in names:
            if n in RUN_RULES:
                out += RULES[n](first)
        return sort_findings(out)

    def workload_metrics(self, x: RuleInput) -> dict[str, Any]:
        """Step figures of one workload: steps, p50/p99/mean, comm shares."""
        f = rm.overlap_figures(x)
        share = f["comm"] / f["step"] if f["step"] else None
        if share is None and f["host_step"]:  # no GPU: the collectives the host ran (gloo)
            share = f["host_comm"] / f["host_step"]
        return _metrics.step_figures(x, share)

    def metrics(self) -> dict[str, Any]:
        """Headline figures (metrics.METRIC_KEYS): the first workload's step p50/p99 and
        communication share, and the run's utilization per chip type, MFU, dropped spans."""
        x = self.inputs[0]
        out = _metrics.headline(x, self.workload_metrics(x))
        # Per-rank GPU time breakdown as HolisticTraceAnalysis defines it (analysis/ranks.py).
        out["ranks"] = self._rank_figures[0]
        # What the peaks and bandwidths come from: a store without one (an imported or
        # round-tripped trace) has no MFU, roofline or bandwidth rules, and says so.
        topo = self.tables.topology
        out["topology"] = {"chips": len(topo.chips), "links": len(topo.links)}
        return out

    def utilization(self, window_ms: float) -> pa.Table:
        """Busy fraction per chip per time window (the `utilization` macro)."""
        return self._macro(f"utilization({float(window_ms)!r}, {self._range()})")

    def utilization_by_type(self, window_ms: float) -> pa.Table:
        """Mean busy fraction per chip type per time window."""
        return self._macro(f"utilization_by_type({float(window_ms)!r}, {self._range()})")

    def link_throughput(self, window_ms: float) -> pa.Table:
        """Bytes/s per link direction per time window, and the fraction of its bandwidth."""
        return self._macro(f"link_throughput({float(window_ms)!r}, {self._range()})")

    def report(self) -> Report:
        """Metrics, findings, the slowest step's critical path and the utilization series."""
        t = self.tables
        paths = self.critical_paths  # slowest step first, then the median one
        median = paths[1] if len(paths) > 1 else (paths[0] if paths else None)
        workloads = []
        for x, w in zip(self.inputs, t.workloads, strict=False):
            slowest = path_dict(x.paths[0] if x.paths else None, max_segments=0)
            workloads.append(
                {
                    "step": w.name,
                    "names": list(w.choice.names[:10]),
                    "reason": w.choice.reason,
                    "training": w.training,
                    **self.workload_metrics(x),
                    "critical_path": slowest,
                }
            )
        metrics = self.metrics()
        return Report(
            metrics,
            self.findings(),
            self.critical_path(),
            utilization_series(t),
            chip_rows(t),
            link_rows(t),
            self.sources,
            median,
            workloads,
            self.endpoints,
            kernel_breakdown(t),
            # HTA's launch queue needs its device events: none where metrics.ranks has none
            self._rank_figures[1] if metrics["ranks"] else [],
            self.time_breakdown(),
        )

    def time_breakdown(self) -> list[dict[str, Any]]:
        """Self time by process, thread and span name (analysis/breakdown.py), for a run
        with no training steps on a GPU/NPU (a browser, a service, PyTorch on the CPU);
        [] for a GPU training run, whose devices the report breaks down instead."""
        t = self.tables
        device = any(ct in COMPUTE_TYPES for ct in t.chips.column("chip_type").to_pylist())
        if not t.spans or (device and any(w.training for w in t.workloads)):
            return []
        return time_breakdown(self.con, t.lo, t.hi)

    def _range(self) -> str:
        s = "NULL" if self.since_ns is None else int(self.since_ns)
        u = "NULL" if self.until_ns is None else int(self.until_ns)
        return f"since_ns := {s}, until_ns := {u}"

    def _macro(self, call: str) -> pa.Table:
        rel = self.con.sql(f"SELECT * FROM {call} ORDER BY ALL")
        return rel.to_arrow_table() if hasattr(rel, "to_arrow_table") else rel.arrow()


def analyze(
    con: Any,
    since_ns: int | None = None,
    until_ns: int | None = None,
    *,
    rules: Iterable[str] | None = None,
    sample_steps: int = 2,
) -> list[Finding]:
    """Findings for a time range of a store: the call a live viewer makes each refresh.

    Args:
        con: a `chiptrace.connect` connection (it must have the analysis macros).
        since_ns, until_ns: the window (Unix ns); None means open-ended.
        rules: rule ids from RULES (default all).
        sample_steps: steps analysed span by span (fewer is cheaper).

    Returns:
        Plain `Finding` dataclasses, most severe first.
    """
    ta = TraceAnalysis(con, since_ns=since_ns, until_ns=until_ns, sample_steps=sample_steps)
    return ta.findings(rules)
