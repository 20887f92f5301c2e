"""Every finding's saving replayed: fix its culprit in each step's graph (whatif.py) and
take what the step gains; rank by it; fold findings with one cause into one with `parts`.

The fix per culprit, what a user would do about it:

- a chip: its work at the median speed of its peers (same type, time per unit of work, so
  a chip dealt bigger batches is not slow), its late starts against them removed; if that
  saves nothing (it is as fast as they are, or has none), the chip twice as fast, else
  every chip of its type (they share the work: Adam on both CPUs), except for findings
  that claim it is slower or busier than its peers (a straggler, an imbalance);
- a link: at its nominal bandwidth (a degraded link); if that saves nothing the link is
  inherently the limit, and the fix is the link twice as fast;
- a downed link: the transfers it pushed elsewhere at their typical time again;
- an overloaded serving queue: every serving device twice as fast;
- outlier requests of a served workload: none (they queued behind others); a training
  loop's outlier steps keep the rule's estimate (their extra, per step).

Findings whose culprit is not a chip or link (an op, a chip type, an opportunity) keep the
rule's own estimate. One whose replay saves under 1% of the step is `info`. Findings of one
rule and step on chips or links of one type that save nothing alone are fixed together:
when that saves the step time, they are one finding whose `parts` lists them (one
saturated PCIe fabric, not twenty saturated links).
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from typing import Any

from chiptrace.analysis import sweep as sweeping
from chiptrace.analysis.findings import Finding, severity_for
from chiptrace.analysis.rule_input import RuleInput
from chiptrace.analysis.rules_links import reported_fractions
from chiptrace.analysis.serving import back_ends, evaluate
from chiptrace.analysis.speeds import peer_speeds, spec_speeds
from chiptrace.analysis.whatif import MAX_GRAPH_SPANS, Change

INFO_BELOW = 0.01  # a fix that saves less than this share of the step is info
# What a trace can resolve: each span costs its tracer about a microsecond (chiptrace's
# @trace 0.8-3 us, a profiler's event about as much: benchmarks/bench_hotpath.py), so a
# saving under a microsecond per span of the step is within the trace's own cost.
RESOLUTION_NS_PER_SPAN = 1_000
TRACED_SOURCES = ("code", "collect")  # writers whose spans were timed in the program
REPLAY_STEPS = 8  # steps replayed per workload to price its findings (spread: p50 holds)
# Rules whose claim is that a chip is slower, later or busier than its peers: made like
# them, a healthy chip (one dealt bigger batches) saves nothing, and the finding is info
# (rebalancing work is a change the replay does not make).
LIKE_PEERS = frozenset({"straggler", "rank-straggler", "step-outliers", "load-imbalance"})


def _kind(x: RuleInput, culprit: str) -> str | None:
    t = x.tables
    if culprit in t.topology.chips or culprit in set(t.chips.column("chip_id").to_pylist()):
        return "chip"
    if t.topology.link(culprit) is not None:
        return "link"
    return None


# Rules that name a chip whose fix lies elsewhere: a GPU idle for its host's launches
# (the host is what to speed up). They keep their own estimate. (A rank late at the
# collectives is replayed: the ranks of a step are one graph, joined at them; where the
# replay finds no late start to remove, it keeps its measured wait: replay_savings.)
OWN_ESTIMATE = frozenset({"launch-bound"})


def _fixes(
    x: RuleInput, f: Finding, speeds: dict[str, float], spec: dict[str, float] | None = None
) -> dict[str, Change]:
    """The candidate fixes of a finding's culprit, best first (empty: not replayable);
    `spec`: lone chips slower than their model (speeds.spec_speeds), by how much."""
    if f.rule in OWN_ESTIMATE or f.evidence.get("chips_lost"):  # no replay adds a chip
        return {}
    if f.rule == "queue-overload":
        parts = f.parts or (f.culprit,)
        slow = {p: speeds[p] for p in parts if speeds.get(p, 1.0) > 1.05}
        capacity = {"capacity": Change(speed=dict.fromkeys(parts, 2.0))}
        # A device slower or later (a straggler's delay) than its peers, or cut off by a
        # downed link, costs the pool: like them, and back, first (none: saves nothing).
        lost = frozenset(str(v) for v in f.evidence.get("cut_off_by") or ())
        like = Change(speed=slow, undelay=frozenset(parts), typical=lost)
        return {"peers": like, **capacity}
    kind = _kind(x, f.culprit)
    if f.rule == "step-outliers" and kind is None and back_ends(x.tables.steps):
        # A served request is an outlier for the time it queued behind others: no change
        # removes that alone (a queue that grows is its own finding, queue-overload).
        return {"extra": Change()}
    if kind == "chip":
        k = speeds.get(f.culprit, 1.0)
        speed = {f.culprit: k} if k > 1.02 else {}
        peers = {"peers": Change(speed=speed, undelay=frozenset({f.culprit}))}
        if f.rule in LIKE_PEERS:  # the claim is "slower than its peers": nothing else
            return peers
        if spec and f.culprit in spec:  # no peers, slower than its model: at its model
            peers = {"spec": Change(speed={f.culprit: spec[f.culprit]})}
        return {
            **peers,
            "chip 2x": Change(speed={f.culprit: 2.0}),
            "type 2x": Change(speed={_type_of(x, f.culprit): 2.0}),
        }
    if kind != "link":
        return {}
    link = x.tables.topology.link(f.culprit)
    nominal = link.bandwidth if link else 0.0
    took = [str(c) for c in f.evidence.get("took_over") or []]
    if took:  # a chip cut off (its link down, or avoided): its peers share its work again
        return {"share": Change(speed=dict.fromkeys(took, (len(took) + 1) / len(took)))}
    if f.rule in ("link-down", "link-avoided"):
        went = [str(v) for v in f.evidence.get("traffic_went_over") or []]
        # queue-overload's cut-off serving devices (a list): the link back brings them back
        fix = "back" if isinstance(f.evidence.get("cut_off"), list) else "typical"
        return {fix: Change(typical=frozenset([f.culprit, *went]))}
    if not nominal:
        return {}
    return {
        "nominal": Change(bandwidth={f.culprit: nominal}),
        "2x": Change(bandwidth={f.culprit: 2 * nominal}),
    }


def _joint(x: RuleInput, members: list[Finding], speeds: dict[str, float]) -> Change:
    """The fix of every member at once (each member's last-resort fix)."""
    speed: dict[str, float] = {}
    bw: dict[str, float] = {}
    undelay: set[str] = set()
    typical: set[str] = set()
    for f in members:
        c = list(_fixes(x, f, speeds).values())[-1]
        speed.update(c.speed)
        bw.update(c.bandwidth)
        undelay |= c.undelay
        typical |= c.typical
    return Change(speed, bw, frozenset(undelay), frozenset(typical))


def _priced(
    x: RuleInput, f: Finding, saving: float, how: str, kind: str | None = None, **extra: Any
) -> Finding:
    share = min(max(saving, 0.0) / x.step_ns, 1.0) if x.step_ns > 0 else 0.0
    sev = "info" if share < INFO_BELOW else severity_for(share)
    ev = {**f.evidence, "what_if": how, **extra}
    return dataclasses.replace(
        f,
        severity=sev,
        share=share,
        saving_ns=max(saving, 0.0),
        evidence=ev,
        kind=kind or f.kind,
    )


# Each fix the replay prices: what it does (said in the finding) and what it says the
# finding is (findings.KINDS): a part back at its peers' speed or its nominal bandwidth was
# a fault; one that had to be made faster than the rack has, a bottleneck. A fix without
# a kind keeps the rule's.
_FIXES: dict[str, tuple[str, str | None]] = {
    "peers": ("its work at its peers' median speed, late starts removed", "fault"),
    "nominal": ("the link at its nominal bandwidth", "fault"),
    "2x": ("the link at twice its nominal bandwidth", "bottleneck"),
    "chip 2x": ("the chip twice as fast (it is as fast as its peers)", "bottleneck"),
    "type 2x": ("every chip of its type twice as fast (they share the work)", "bottleneck"),
    "typical": ("the transfers it pushed elsewhere at their typical time", "fault"),
    "back": ("the serving devices it cut off back in the pool (the batcher replayed)", "fault"),
    "share": ("the chip it cut off doing its share again (its peers that much faster)", "fault"),
    "spec": ("the chip at its model's speed (it has no peers and ran slower than that)", "fault"),
    "joint": ("every part fixed together", None),
    "capacity": ("every serving device twice as fast", "bottleneck"),
    "extra": ("nothing: served requests are outliers for the time they queued", None),
}


def _not_down(x: RuleInput, found: list[Finding]) -> list[Finding]:
    """A link that carried nothing but is reported up at reduced bandwidth is not down:
    routing went around it. Same culprit, said as it is."""
    state = reported_fractions(x)
    out = []
    for f in found:
        frac = state.get(f.culprit) if f.rule == "link-down" else None
        if frac is None:
            out.append(f)
            continue
        ev = {**f.evidence, "recorded_bandwidth_fraction": frac}
        text = (
            f"{f.culprit} carried nothing: it is up at {frac:.0%} of its bandwidth and routing "
            "goes around it; fix the link (cable, lanes, link training) to get its paths back"
        )
        out.append(dataclasses.replace(f, rule="link-avoided", evidence=ev, suggestion=text))
    return out


def replay_savings(x: RuleInput, found: list[Finding], sweep: bool = True) -> list[Finding]:
    """`found` (one workload's findings) with replayed savings, folded, most severe first;
    with `sweep`, chips no rule named that the replay says would save the step, too."""
    found = _not_down(x, found)
    if x.con is None or not x.tables.steps.num_rows:
        return found
    speeds = peer_speeds(x)
    spec = spec_speeds(x, speeds)
    fixes = {i: _fixes(x, f, speeds, spec) for i, f in enumerate(found) if f.step == x.workload}
    changes = {f"{i}:{k}": c for i, fx in fixes.items() for k, c in fx.items()}
    if sweep:
        changes.update(sweeping.candidates(x, found, speeds, spec))
    if not changes:
        return found
    res = _evaluate(x, changes)
    if not res:
        return found
    out: list[Finding] = sweeping.findings(x, res, speeds, spec)
    for i, f in enumerate(found):
        if not fixes.get(i):
            # Not replayable (an op, a chip type, an opportunity): its own estimate, and
            # under 1% of the step it is info like any other.
            small = f.step == x.workload and f.share < INFO_BELOW and f.severity != "info"
            out.append(dataclasses.replace(f, severity="info") if small else f)
            continue
        best = next(
            (k for k in fixes[i] if res[f"{i}:{k}"]["saving_ns"] >= INFO_BELOW * x.step_ns),
            list(fixes[i])[-1],
        )
        saving = res[f"{i}:{best}"]["saving_ns"]
        if f.rule == "rank-straggler" and saving < INFO_BELOW * x.step_ns <= f.saving_ns:
            # The replay removes a rank's late start; a rank late at each collective with
            # nothing in its trace before the arrival (no gap the graph can close) keeps
            # what the others were measured to wait for it.
            out.append(f)
            continue
        out.append(_priced(x, f, saving, *_FIXES[best]))
    return _fold(x, out, speeds)


def below_resolution(x: RuleInput, found: list[Finding]) -> list[Finding]:
    """`found` with any saving the trace cannot resolve (under RESOLUTION_NS_PER_SPAN per
    span of its step: a toy loop's microseconds) made info: the tracer's own cost is as big.
    Only spans an in-process tracer recorded carry that cost in their times (chiptrace's
    recorder, an OpenTelemetry SDK's through collect); emulated spans and a profiler's
    device timestamps do not, and get no floor."""
    traced = [m for m in x.tables.manifests if m.get("source") in TRACED_SOURCES]
    if not x.step_p50_ns or not traced or len(traced) < len(x.tables.manifests):
        return found
    floor = RESOLUTION_NS_PER_SPAN * x.tables.spans / x.n_steps
    out = []
    for f in found:
        if f.step == x.workload and f.severity != "info" and 0 < f.saving_ns < floor:
            ev = {**f.evidence, "below_resolution_ms": round(floor / 1e6, 6)}
            f = dataclasses.replace(f, severity="info", evidence=ev)
        out.append(f)
    return out


def _evaluate(x: RuleInput, changes: dict[str, Change]) -> dict[str, dict[str, float]]:
    steps = x.tables.steps
    # Served requests all share one replay of the batches: price the mean over all of them.
    if steps.num_rows > REPLAY_STEPS and not back_ends(steps):
        from chiptrace.analysis.whatif import spread_groups

        steps = steps.take(spread_groups(steps, REPLAY_STEPS))
    return evaluate(x.con, steps, x.tables.topology, changes, x.stages)


def _fold(x: RuleInput, found: list[Finding], speeds: dict[str, float]) -> list[Finding]:
    """One finding per (rule, step, culprit) (a link's two directions are one), then the
    findings of one rule and step on chips or links of one type that are not faults priced
    together: when no one of them saves half of what fixing them all does, they are one
    cause, one finding with `parts`."""
    best: dict[tuple[str, str | None, str], Finding] = {}
    for f in found:
        k = (f.rule, f.step, f.culprit)
        # A replayed saving beats a rule's own estimate of the same cause (a serving pool's
        # lost device priced by its batcher, not by its share of the work), then the larger.
        if k not in best or _replayed_first(f) > _replayed_first(best[k]):
            best[k] = f
    found = [f for f in found if best[(f.rule, f.step, f.culprit)] is f]
    groups: dict[tuple[str, str, str], list[Finding]] = defaultdict(list)
    for f in found:
        kind = _kind(x, f.culprit)
        # A fault (a link back at its nominal bandwidth saves the step) is its own cause:
        # folded into the fabric it would claim the fabric's saving.
        if kind and f.evidence.get("what_if") and f.kind != "fault":
            groups[(f.rule, kind, _type_of(x, f.culprit))].append(f)
    groups = {k: v for k, v in groups.items() if len(v) > 1}
    res = _evaluate(x, {"|".join(k): _joint(x, v, speeds) for k, v in groups.items()})
    out, folded = list(found), set()
    for k, members in groups.items():
        joint = res["|".join(k)]["saving_ns"] if res else 0.0
        if max(f.saving_ns for f in members) >= 0.5 * joint or joint <= 0:
            continue
        folded |= {id(f) for f in members}
        lead = max(members, key=lambda f: (f.saving_ns, f.evidence.get("busy_share") or 0.0))
        parts = tuple(sorted(f.culprit for f in members))
        # Parts that save nothing alone but the step together: the fabric's design (a
        # bottleneck), unless every one of them was below its own spec.
        kind = "fault" if all(m.kind == "fault" for m in members) else "bottleneck"
        f = _priced(x, lead, joint, _FIXES["joint"][0], kind, parts=len(parts))
        out.append(dataclasses.replace(f, parts=parts))
    return [f for f in out if id(f) not in folded]


def _replayed_first(f: Finding) -> tuple[bool, float]:
    return (bool(f.evidence.get("what_if")), f.saving_ns)


def _type_of(x: RuleInput, culprit: str) -> str:
    spec = x.tables.topology.link(culprit)
    if spec is not None:
        return spec.type
    chip = x.tables.topology.chips.get(culprit)
    return chip.type if chip else culprit.split(":", 1)[0]


__all__ = ["INFO_BELOW", "MAX_GRAPH_SPANS", "replay_savings"]
