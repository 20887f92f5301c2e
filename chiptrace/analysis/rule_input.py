"""What a rule reads (`RuleInput`), and the helpers every rule shares.

Rules run once per workload (a step name: `train_step`, `request`): the input holds that
workload's steps, its sampled steps span by span, their critical paths, and the chips and
links it owns, so a rule compares only chips that do the same work and states its saving
per step of that workload.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, overload

from chiptrace.analysis.findings import CriticalPath, Finding, severity_for
from chiptrace.analysis.steps import Step, step_groups
from chiptrace.analysis.tables import TraceTables


@dataclass
class RuleInput:
    """Everything a rule may read: the run's tables and one workload's detail.

    Attributes:
        tables: the run's tables, `steps` and `step_chips` those of this workload.
        steps: the sampled steps, span by span (slowest first, then the median).
        paths: their critical paths.
        step_p50_ns: the workload's median step time (0 without steps).
        workload: the step name (None: a run without steps).
        chips, links: the chip and link ids this workload owns (None: every one).
        con: the store's connection, for rules that read spans or host samples directly.
        endpoints: the per-endpoint table (`rules_run.endpoints`), where computed.
        training: whether the trace shows the steps are training steps; step and training
            rules (step-outliers, straggler, starvation) leave tasks alone.
    """

    tables: TraceTables
    steps: list[Step] = field(default_factory=list)
    paths: list[CriticalPath] = field(default_factory=list)
    step_p50_ns: float = 0.0
    workload: str | None = None
    chips: frozenset[str] | None = None
    links: frozenset[str] | None = None
    con: Any = None
    endpoints: list[dict[str, Any]] | None = None
    memo: dict[str, Any] = field(default_factory=dict)  # figures several rules share
    training: bool = True  # the steps are training steps (WorkloadTables.training), not tasks
    # Where per-step work such as the what-if replays runs (analysis/stages.Stages: here, or
    # as Dask tasks); None: here, on `con`.
    stages: Any = None

    @property
    def step_ns(self) -> float:
        """The time unit shares are taken of: the median step, else the wall time."""
        return self.step_p50_ns or float(self.tables.wall_ns)

    @property
    def n_steps(self) -> int:
        """Steps in the workload, each rank's copy of a step counted once (at least 1: a
        run without steps is one long step): a chip's run total over this is per step."""
        if not self.step_p50_ns:
            return 1
        if "n_steps" not in self.memo:
            self.memo["n_steps"] = max(len(step_groups(self.tables.steps)), 1)
        return int(self.memo["n_steps"])

    def chip_rows(self) -> list[dict[str, Any]]:
        """Rows of `tables.chips` for the chips this workload owns."""
        return _own(self.tables.chips.to_pylist(), "chip_id", self.chips)

    def chip_op_rows(self) -> list[dict[str, Any]]:
        """Rows of `tables.chip_ops` for the chips this workload owns."""
        return _own(self.tables.chip_ops.to_pylist(), "chip_id", self.chips)

    def link_rows(self) -> list[dict[str, Any]]:
        """Rows of `tables.links` (link directions) for the links this workload owns."""
        return _own(self.tables.links.to_pylist(), "link_id", self.links)

    def finding(
        self,
        rule: str,
        culprit: str,
        evidence: dict[str, Any],
        suggestion: str,
        saving_ns: float,
        severity: str | None = None,
    ) -> Finding:
        """A Finding about this workload: share = saving per step / median step."""
        saving = max(float(saving_ns), 0.0)
        share = min(saving / self.step_ns, 1.0) if self.step_ns > 0 else 0.0
        return Finding(
            rule,
            severity or severity_for(share),
            culprit,
            evidence,
            suggestion,
            share,
            saving,
            self.workload,
        )


def _own(rows: list[dict[str, Any]], key: str, ids: frozenset[str] | None) -> list[dict]:
    return rows if ids is None else [r for r in rows if r[key] in ids]


def robust_z(value: float, values: Iterable[float], floor: float) -> float:
    """Modified z-score of `value` among `values`: (x - median) / (1.4826 * MAD)."""
    values = list(values)
    med = statistics.median(values)
    mad = statistics.median([abs(v - med) for v in values])
    return (value - med) / max(1.4826 * mad, floor, 1e-9)


@overload
def ms(ns: float) -> float: ...
@overload
def ms(ns: None) -> None: ...
@overload
def ms(ns: float | None) -> float | None: ...


def ms(ns: float | None) -> float | None:
    """Nanoseconds as milliseconds, rounded for evidence."""
    return None if ns is None else round(ns / 1e6, 4)


def rank_z(a: list[float], b: list[float]) -> float:
    """Mann-Whitney rank-sum z of sample `a` against `b` (positive: `a` runs larger);
    ties get their mean rank. Distribution-free: queueing makes request times skewed."""
    pooled = sorted([(v, 0) for v in a] + [(v, 1) for v in b])
    ranks = [0.0] * len(pooled)
    i = 0
    while i < len(pooled):
        j = i
        while j + 1 < len(pooled) and pooled[j + 1][0] == pooled[i][0]:
            j += 1
        for k in range(i, j + 1):
            ranks[k] = (i + j) / 2 + 1
        i = j + 1
    n, m = len(a), len(b)
    u = sum(r for r, (_, side) in zip(ranks, pooled, strict=True) if side == 0) - n * (n + 1) / 2
    sd = (n * m * (n + m + 1) / 12) ** 0.5
    return (u - n * m / 2) / sd if sd else 0.0
