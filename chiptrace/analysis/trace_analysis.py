"""The front door: `TraceAnalysis` over a trace dir, and `analyze()` for a live window."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from chiptrace.analysis import metrics as _metrics
from chiptrace.analysis import rules_chips as rc
from chiptrace.analysis import rules_comm as rm
from chiptrace.analysis.critical_path import critical_path
from chiptrace.analysis.model import CriticalPath, Finding, sort_findings
from chiptrace.analysis.ranks import rank_breakdown
from chiptrace.analysis.steps import Step, load_steps, pick_steps
from chiptrace.analysis.tables import TraceTables, load_tables

Rule = Callable[[rc.RuleInput], list[Finding]]

#: Every rule by id, in the order they run.
RULES: dict[str, Rule] = {
    "straggler": rc.straggler,
    "load-imbalance": rc.load_imbalance,
    "compute-bound": rc.roofline,  # also yields memory-bound findings
    "precision-opportunity": rc.precision_opportunity,
    "starvation": rc.starvation,
    "link-bound": rm.link_bound,
    "latency-bound": rm.latency_bound,
    "poor-overlap": rm.poor_overlap,
    "dropped-spans": rm.dropped_spans,
}

REPORT_VERSION = 1
SAMPLE_SPANS = 150_000  # spans analysed one by one (critical path, overlap, starvation)
# A step bigger than this is not walked span by span (Python, ~10 us a span): an nvl72 step
# has ~2M spans. Its critical path, overlap and starvation are then left out, and said so.
MAX_STEP_SPANS = 400_000


def run_rules(x: rc.RuleInput, rules: Iterable[str] | None = None) -> list[Finding]:
    """Run the named rules (default: all) and return their findings, most severe first."""
    found: list[Finding] = []
    names = list(rules) if rules is not None else list(RULES)
    stragglers: set[str] = set()
    for name in names:
        if name == "load-imbalance":
            found += rc.load_imbalance(x, skip=stragglers)
            continue
        out = RULES[name](x)
        if name == "straggler":
            stragglers = {f.culprit for f in out}
        found += out
    return sort_findings(found)


@dataclass(frozen=True)
class Report:
    """Everything `chiptrace report` shows; `to_dict()` is the documented JSON."""

    metrics: dict[str, Any]
    findings: list[Finding]
    critical_path: CriticalPath | None
    utilization: dict[str, Any]
    chips: list[dict[str, Any]] = field(default_factory=list)
    links: list[dict[str, Any]] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)
    median_path: CriticalPath | None = None

    def to_dict(self) -> dict[str, Any]:
        """Stable keys: version, sources, metrics, findings, critical_path (slowest step),
        critical_path_median (median step), utilization, chips, links (docs/sql.md)."""
        return {
            "version": REPORT_VERSION,
            "sources": self.sources,
            "metrics": self.metrics,
            "findings": [f.to_dict() for f in self.findings],
            "critical_path": path_dict(self.critical_path),
            "critical_path_median": path_dict(self.median_path, max_segments=0),
            "utilization": self.utilization,
            "chips": self.chips,
            "links": self.links,
        }


def path_dict(p: CriticalPath | None, max_segments: int = 200) -> dict[str, Any] | None:
    """A critical path as plain JSON: shares by chip type, link type, op kind, and segments."""
    if p is None or not p.segments:
        return None
    segs = [
        {
            "name": s.name,
            "via": s.via,
            "chip_id": s.chip_id,
            "link_id": s.link_id,
            "op_kind": s.op_kind,
            "start_ms": round((s.start_ns - p.start_ns) / 1e6, 6),
            "on_path_ms": round(s.on_path_ns / 1e6, 6),
        }
        for s in p.segments[:max_segments]
    ]
    return {
        "trace_id": p.trace_id,
        "root": p.root,
        "duration_ms": round(p.duration_ns / 1e6, 6),
        "by_chip_type": _r(p.share("chip_type")),
        "by_link_type": _r(p.share("link_type")),
        "by_op_kind": _r(p.share("op_kind")),
        "by_name": _r(dict(list(p.share("name").items())[:10])),
        "segments": segs,
        "segments_total": len(p.segments),
    }


def _r(d: dict[str, float]) -> dict[str, float]:
    return {k: round(v, 4) for k, v in d.items()}


class TraceAnalysis:
    """Analyse one run: utilization, critical path, bottleneck findings, headline metrics.

    Args:
        source: trace dir(s) / glob(s), or a connection from `chiptrace.connect`.
        since_ns, until_ns: analyse only this time range (Unix ns).
        step_name: root span name of a step (default: the most common root with children).
        sample_steps: how many steps get span-level analysis (critical path, overlap,
            starvation): the slowest, the median, and some spread over the run.
        windows: points in the utilization-over-time series.
        max_step_spans: steps with more spans than this (on average) get no span-level
            analysis (critical path, overlap, starvation): it runs in Python.

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
    ) -> None:
        if hasattr(source, "sql") and hasattr(source, "execute"):
            self.con = source
            self.sources: list[str] = []
        else:
            from chiptrace.query import connect

            self.con = connect(source)
            paths = [source] if isinstance(source, (str, os.PathLike)) else list(source)
            self.sources = [os.fspath(p) for p in paths]
        self.since_ns, self.until_ns = since_ns, until_ns
        self.step_name, self.sample_steps, self.windows = step_name, sample_steps, windows
        self.max_step_spans = max_step_spans

    @cached_property
    def tables(self) -> TraceTables:
        """The run reduced to per-chip, per-link, per-step tables (computed once)."""
        return load_tables(
            self.con, self.since_ns, self.until_ns, windows=self.windows, step_name=self.step_name
        )

    @cached_property
    def steps(self) -> list[Step]:
        """The sampled steps with all their spans: slowest first, then the median."""
        t = self.tables
        # Span-level work is Python: keep it to about SAMPLE_SPANS spans in all.
        per_step = t.spans / max(t.steps.num_rows, 1)
        if per_step > self.max_step_spans:
            return []
        k = max(1, min(self.sample_steps, int(SAMPLE_SPANS // max(per_step, 1))))
        return load_steps(self.con, t.steps, pick_steps(t.steps, k if self.sample_steps else 0))

    @cached_property
    def critical_paths(self) -> list[CriticalPath]:
        """Critical path of each sampled step (slowest first)."""
        return [critical_path(s.spans, s.root_id) for s in self.steps]

    def critical_path(self, trace_id: str | None = None) -> CriticalPath | None:
        """Critical path of one step (hex trace id), default the slowest; None if no steps."""
        if trace_id is None:
            return self.critical_paths[0] if self.critical_paths else None
        for s, p in zip(self.steps, self.critical_paths, strict=True):
            if s.trace_id == trace_id:
                return p
        rows = self.tables.steps.filter(pc.equal(self.tables.steps["trace_id"], trace_id))
        steps = load_steps(self.con, rows, [0] if rows.num_rows else [])
        return critical_path(steps[0].spans, steps[0].root_id) if steps else None

    @cached_property
    def rule_input(self) -> rc.RuleInput:
        durs = _metrics.step_durations(rc.RuleInput(self.tables))
        p50 = _metrics.percentile(durs, 50) or 0.0
        return rc.RuleInput(self.tables, self.steps, self.critical_paths, float(p50))

    def findings(self, rules: Iterable[str] | None = None) -> list[Finding]:
        """Bottlenecks, most severe first, then by share of step time at stake."""
        return run_rules(self.rule_input, rules)

    def metrics(self) -> dict[str, Any]:
        """Headline figures (metrics.METRIC_KEYS): step p50/p99, utilization per chip
        type, communication share, MFU, dropped spans."""
        f = rm.overlap_figures(self.rule_input)
        share = f["comm"] / f["step"] if f["step"] else None
        out = _metrics.headline(self.rule_input, share)
        # --- issue 14 hook: per-rank GPU breakdown as HTA defines it (analysis/ranks.py).
        out["ranks"] = rank_breakdown(self.con, self.since_ns, self.until_ns)
        # --- end issue 14 hook
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
        chips = [
            {
                "chip_id": r["chip_id"],
                "chip_type": r["chip_type"],
                "ops": r["ops"],
                "utilization": round(r["busy_ns"] / t.wall_ns, 4),
            }
            for r in t.chips.to_pylist()
        ]
        links = [
            {
                "link_id": r["link_id"],
                "link_type": r["link_type"],
                "src": r["link_src"],
                "dst": r["link_dst"],
                "transfers": r["transfers"],
                "bytes": r["bytes"],
                "busy_share": round(r["busy_ns"] / t.wall_ns, 4),
                "GBps_while_busy": round(r["bytes"] / r["busy_ns"], 3) if r["busy_ns"] else None,
                "bandwidth_GBps": _gb(t.topology.bandwidth(r["link_id"])),
                "bandwidth_fraction_while_busy": _frac(r, t.topology.bandwidth(r["link_id"])),
            }
            for r in t.links.to_pylist()
        ]
        paths = self.critical_paths  # slowest step first, then the median one
        median = paths[1] if len(paths) > 1 else (paths[0] if paths else None)
        return Report(
            self.metrics(),
            self.findings(),
            self.critical_path(),
            utilization_series(t),
            chips,
            links,
            self.sources,
            median,
        )

    def _range(self) -> str:
        s = "NULL" if self.since_ns is None else int(self.since_ns)
        u = "NULL" if self.until_ns is None else int(self.until_ns)
        return f"since_ns := {s}, until_ns := {u}"

    def _macro(self, call: str) -> pa.Table:
        rel = self.con.sql(f"SELECT * FROM {call} ORDER BY ALL")
        return rel.to_arrow_table() if hasattr(rel, "to_arrow_table") else rel.arrow()


def _gb(bps: float | None) -> float | None:
    return None if bps is None else round(bps / 1e9, 3)


def _frac(r: dict[str, Any], bps: float | None) -> float | None:
    if not bps or not r["busy_ns"] or not r["bytes"]:
        return None
    return round(r["bytes"] / r["busy_ns"] * 1e9 / bps, 4)


def utilization_series(t: TraceTables) -> dict[str, Any]:
    """Mean utilization per chip type per window: {window_ms, t0_ns, series: {type: [..]}}."""
    n_win = max((t.wall_ns + t.window_ns - 1) // t.window_ns, 1)
    count: dict[str, int] = {}
    type_of: dict[str, str] = {}
    for r in t.chips.to_pylist():
        count[r["chip_type"]] = count.get(r["chip_type"], 0) + 1
        type_of[r["chip_id"]] = r["chip_type"]
    series = {ct: [0.0] * n_win for ct in sorted(count)}
    for r in t.util.to_pylist():
        k = int(r["window_index"])
        ctype = type_of.get(r["chip_id"])
        if 0 <= k < n_win and ctype in series:
            width = min(t.window_ns, t.t1 - (t.t0 + k * t.window_ns)) or 1
            series[ctype][k] += r["busy_ns"] / width / count[ctype]
    return {
        "window_ms": round(t.window_ns / 1e6, 6),
        "t0_ns": t.t0,
        "series": {k: [round(v, 4) for v in vs] for k, vs in series.items()},
    }


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
