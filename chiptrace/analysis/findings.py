"""Plain result types of the analysis: findings, severities, critical-path segments.

Everything here is a frozen dataclass of str/int/float/dict values, so a caller (the report,
the diff, the live viewer) can keep, compare and serialize results without the store.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

SEVERITIES = ("high", "medium", "low", "info")
_RANK = {s: i for i, s in enumerate(SEVERITIES)}


def severity_for(share: float, high: float = 0.10, medium: float = 0.03) -> str:
    """Severity from the share of step time at stake: >=10% high, >=3% medium, else low."""
    if share >= high:
        return "high"
    if share >= medium:
        return "medium"
    return "low"


#: What a finding is, in the order the report lists them (docs/sql.md, `kind`):
#: - `fault`: a part doing less than it should (slower or later than its peers, a link
#:   below its nominal bandwidth or down, a rank late): fixing it restores the spec;
#: - `bottleneck`: a part working as specified that the step waits for (a saturated
#:   fabric, the only DPU): its saving is that of a faster part, an upgrade or a re-design;
#: - `opportunity`: a change to the program (a faster precision, pinned memory), not a
#:   part: its saving is the rule's estimate.
KINDS = ("fault", "bottleneck", "opportunity")
_KIND_RANK = {k: i for i, k in enumerate(KINDS)}
#: Rules that name an opportunity (a change to the program), never a fault or bottleneck.
OPPORTUNITIES = frozenset({"precision-opportunity", "pageable-copy"})
#: Rules whose claim is a fault by itself; the replay decides for the others (ranking.py).
FAULTS = frozenset(
    {"link-down", "link-avoided", "straggler", "rank-straggler", "error-rate", "dropped-spans"}
)


def kind_of(rule: str) -> str:
    """A rule's kind before its finding is priced (ranking.py may say fault or bottleneck)."""
    if rule in OPPORTUNITIES:
        return "opportunity"
    return "fault" if rule in FAULTS else "bottleneck"


@dataclass(frozen=True, slots=True)
class Finding:
    """One bottleneck: what, where, how sure, what to try, and what fixing it would save.

    Attributes:
        rule: the rule's id, e.g. ``straggler`` or ``link-bound`` (see RULES).
        severity: ``high``, ``medium``, ``low`` or ``info``.
        culprit: the chip id, link id, op name or chip type held responsible.
        evidence: the figures the rule decided on (plain numbers and strings).
        suggestion: one line on what to try.
        share: the estimated saving as a fraction of the step (``saving_ns / step``), 0..1;
            orders findings of equal severity.
        saving_ns: what fixing it would save per step (ns), an estimate; 0 when unknown.
        step: the step name (the workload) the finding is about; None for whole-run findings.
        parts: the chips or links one finding covers when they share one cause (a
            saturated fabric's links); `culprit` is one of them. Empty for one culprit.
        kind: ``fault``, ``bottleneck`` or ``opportunity`` (KINDS); default from the rule.
    """

    rule: str
    severity: str
    culprit: str
    evidence: dict[str, Any]
    suggestion: str
    share: float = 0.0
    saving_ns: float = 0.0
    step: str | None = None
    parts: tuple[str, ...] = ()
    kind: str = ""

    def __post_init__(self) -> None:
        if not self.kind:
            object.__setattr__(self, "kind", kind_of(self.rule))

    def to_dict(self) -> dict[str, Any]:
        """The stable JSON form: rule, severity, culprit, evidence, suggestion, share, step,
        saving_ms (per step), saving_pct (of the step), parts and kind."""
        return {
            "rule": self.rule,
            "severity": self.severity,
            "culprit": self.culprit,
            "evidence": dict(self.evidence),
            "suggestion": self.suggestion,
            "share": round(self.share, 6),
            "step": self.step,
            "saving_ms": round(self.saving_ns / 1e6, 4),
            "saving_pct": round(self.share * 100, 2),
            "parts": list(self.parts),
            "kind": self.kind,
        }

    @property
    def key(self) -> tuple[str, str]:
        """(rule, culprit): how the diff matches a finding across two runs."""
        return (self.rule, self.culprit)


#: Which rule ranks first when two findings put the same time at stake (a slow chip is
#: both a straggler and below its roofline; the straggler says what it costs the step).
RULE_ORDER = (
    "link-down",
    "link-avoided",
    "queue-overload",
    "straggler",
    "critical-chip",
    "link-bound",
    "compute-bound",
    "load-imbalance",
    "rank-straggler",
    "launch-bound",
    "data-loading",
    "host-bound",
    "starvation",
    "exposed-comm",
    "poor-overlap",
    "latency-bound",
    "pageable-copy",
    "step-outliers",
    "long-tasks",
    "warm-up",
    "host-contention",
    "error-rate",
    "tail-latency",
    "dropped-spans",
)
_ORDER = {r: i for i, r in enumerate(RULE_ORDER)}


def sort_findings(findings: list[Finding]) -> list[Finding]:
    """Faults, then bottlenecks, then opportunities, and info findings (under 1% of the
    step) after all of them; within each, most severe first, then the largest share of
    step time at stake (to the percent), then RULE_ORDER, then by name.

    Why by kind first: a fault's saving is the part back at its spec, a bottleneck's that
    of a faster part than the rack has (twice as fast: a choice, not a measurement), an
    opportunity's the rule's estimate of a program change. They are not one scale, and
    the first question is what is broken."""
    return sorted(
        findings,
        key=lambda f: (
            f.severity == "info",
            _KIND_RANK.get(f.kind, len(KINDS)),
            _RANK.get(f.severity, 9),
            -round(f.share, 2),
            _ORDER.get(f.rule, len(_ORDER)),
            f.rule,
            f.culprit,
        ),
    )


@dataclass(frozen=True, slots=True)
class PathSegment:
    """A stretch of the critical path: a span, or a gap where nothing traced ran.

    `via` says how the walk reached the span from the one after it: ``end`` (the step's last
    work), ``link`` (an OTel link: this span fed the next), ``resource`` (previous work on the
    same chip or link direction), ``sequence`` (an earlier sibling in program order), or
    ``gap`` for untraced time.
    """

    name: str
    start_ns: int
    end_ns: int
    on_path_ns: int
    via: str
    span_id: str | None = None
    chip_id: str | None = None
    chip_type: str | None = None
    link_id: str | None = None
    link_type: str | None = None
    op_kind: str | None = None


@dataclass(frozen=True, slots=True)
class CriticalPath:
    """The chain of spans that sets one step's end-to-end time."""

    trace_id: str
    root: str
    start_ns: int
    end_ns: int
    segments: tuple[PathSegment, ...] = field(default_factory=tuple)
    root_end_ns: int | None = None  # the root span's end, where device work runs past it

    @property
    def duration_ns(self) -> int:
        return self.end_ns - self.start_ns

    def share(self, by: str) -> dict[str, float]:
        """Fraction of the step's time on the path per `chip_type`, `link_type`, `op_kind`
        or `name`. Untraced time is ``gap``; transfers count as ``link`` by chip type, and
        work off any link as ``none`` by link type, spans without the column ``untagged``."""
        out: dict[str, float] = {}
        total = max(self.duration_ns, 1)
        for seg in self.segments:
            key = getattr(seg, by) or _fallback(seg, by)
            out[key] = out.get(key, 0.0) + seg.on_path_ns / total
        return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def _fallback(seg: PathSegment, by: str) -> str:
    if seg.via == "gap":
        return "gap"
    if by == "chip_type" and seg.link_id:
        return "link"
    if by == "link_type":
        return "none"
    return "untagged"
