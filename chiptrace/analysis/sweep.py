"""Causal-profiling sweep (after Coz, SOSP 2015): replay each chip made like its peers and
report the ones that would save the step time, whatever the rules said.

A rule sees a symptom (busy longer, starts later, below its roofline) and may miss a
culprit whose symptom is small or hidden (a straggler in a mixed run, a slow NPU whose
requests queue). Here every chip that has peers (others of its type in the workload) is
replayed at its peers' median speed per unit of work with its late starts removed; one
that saves at least MIN_SHARE of the step and that no finding names yet becomes a
`straggler` finding (found by the replay, its saving that replay's). A chip with no peers
(pcie8's one DPU) is replayed twice as fast instead: one the step waits for is a
`critical-chip` finding.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from typing import Any

from chiptrace.analysis.findings import Finding
from chiptrace.analysis.rule_input import RuleInput
from chiptrace.analysis.whatif import Change

MIN_SHARE = 0.01  # what a chip must save to be reported without a rule naming it (info below)
DEVICE_TYPES = ("gpu", "npu", "cpu", "dpu")


def candidates(
    x: RuleInput, found: list[Finding], speeds: dict[str, float], spec: dict[str, float]
) -> dict[str, Change]:
    """A what-if per chip that no finding names, keyed `sweep:CHIP`: like its peers, or
    with none at its model's speed where it ran slower (`spec`), else twice as fast."""
    named = {f.culprit for f in found} | {p for f in found for p in f.parts}
    # Chips that did a cut-off peer's share (link-down): that finding prices them already.
    named |= {str(c) for f in found for c in f.evidence.get("took_over") or []}
    by_type: dict[str, list[str]] = defaultdict(list)
    for r in x.chip_rows():
        if r["chip_type"] in DEVICE_TYPES:
            by_type[r["chip_type"]].append(r["chip_id"])
    out = {}
    for chips in by_type.values():
        if len(chips) < 2:  # no peers: is it what the step waits for? twice as fast
            if chips[0] not in named:
                out[f"sweep:{chips[0]}"] = Change(speed={chips[0]: spec.get(chips[0], 2.0)})
            continue
        for c in chips:
            if c in named:
                continue
            k = speeds.get(c, 1.0)
            out[f"sweep:{c}"] = Change(speed={c: k} if k > 1.02 else {}, undelay=frozenset({c}))
    return out


def findings(
    x: RuleInput, res: dict[str, dict[str, float]], speeds: dict[str, float], spec: dict[str, float]
) -> list[Finding]:
    """The swept chips whose replay saves at least MIN_SHARE of the step."""
    out = []
    for key, r in res.items():
        if not key.startswith("sweep:") or r["saving_ns"] < MIN_SHARE * x.step_ns:
            continue
        chip = key.split(":", 1)[1]
        if chip not in speeds:  # the only one of its type: the step waits for it
            out.append(_critical(x, chip, r["saving_ns"], spec.get(chip)))
            continue
        k = speeds.get(chip, 1.0)
        what = (
            f"does the same work {k:.2f}x slower than its peers"
            if k > 1.02
            else "starts its work later than its peers"
        )
        ev: dict[str, Any] = {
            "found_by": "replay",
            "what_if": "its work at its peers' median speed, late starts removed",
            "slower_than_peers": round(k, 3),
            "saving_ms": round(r["saving_ns"] / 1e6, 4),
        }
        out.append(
            x.finding(
                "straggler",
                chip,
                ev,
                f"{chip} {what}; made like them the step saves {r['saving_ns'] / 1e6:,.2f} ms: "
                "check its clocks, thermals, placement and what it waits for",
                r["saving_ns"],
            )
        )
    return out


def _critical(x: RuleInput, chip: str, saving: float, slower: float | None) -> Finding:
    if slower is not None:  # slower than its model: a fault, priced at its model's speed
        f = x.finding(
            "critical-chip",
            chip,
            {
                "found_by": "replay",
                "what_if": "the chip at its model's speed",
                "slower_than_model": round(slower, 3),
                "saving_ms": round(saving / 1e6, 4),
            },
            f"{chip} is the only chip of its type here, the step waits for it, and it runs "
            f"{slower:.2f}x slower than its model: at its model's speed the step saves "
            f"{saving / 1e6:,.2f} ms; check its clocks, thermals and what else runs on it",
            saving,
        )
        return dataclasses.replace(f, kind="fault")
    return x.finding(
        "critical-chip",
        chip,
        {
            "found_by": "replay",
            "what_if": "the chip twice as fast",
            "saving_ms": round(saving / 1e6, 4),
        },
        f"{chip} is the only chip of its type here and the step waits for it: twice as fast, "
        f"the step saves {saving / 1e6:,.2f} ms; give its work more capacity or move some of it",
        saving,
    )
