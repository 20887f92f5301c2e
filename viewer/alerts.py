"""Live bottleneck alerts from a dashboard snapshot: cheap rules over the window's figures.

These run every refresh, so they look only at the snapshot (O(chips + links)). The
analysis package's rules (`chiptrace.analysis.analyze` over the window, in DuckDB) run in a
worker every few seconds when the source keeps a store; `merge` joins the two lists.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from chiptrace.viewer.live_model import Snapshot

SATURATED = 0.90  # throughput / bandwidth, or busy fraction when no bandwidth is known
IDLE = 0.05
PEERS_BUSY = 0.30


@dataclass(frozen=True, slots=True)
class Alert:
    """One live finding: how bad, which rule, who, and a one-line explanation."""

    severity: str  # high, medium, low, info
    rule: str
    culprit: str
    message: str


def saturated_links(snap: Snapshot) -> list[Alert]:
    """A link direction running at >= 90% of its bandwidth, or busy >= 90% of the window
    (at a fraction of its nominal bandwidth, that is a degraded or latency-bound link)."""
    out, slow = [], []
    for link in snap.links:
        sat = link.saturation
        if sat is not None and sat >= SATURATED:
            out.append(
                Alert("high", "link-saturated", link.id, f"{link.id} at {sat:.0%} of its bandwidth")
            )
        elif sat is None and link.utilization >= SATURATED:
            out.append(
                Alert(
                    "medium",
                    "link-busy",
                    link.id,
                    f"{link.id} busy {link.utilization:.0%} of the window",
                )
            )
        elif link.utilization >= SATURATED:  # always busy, yet far below its nominal bandwidth
            slow.append(link)
    # A transfer is as slow as its narrowest hop, so the hops after a degraded link look slow
    # too; the degraded one is slow in both directions (its own traffic each way).
    directions = {(r.type, r.src, r.dst) for r in slow}
    for r in slow:
        both = (r.type, r.dst, r.src) in directions and r.src != r.dst
        out.append(
            Alert(
                "high" if both else "medium",
                "link-slow",
                r.id,
                f"{r.id} busy {r.utilization:.0%} at {r.saturation:.0%} of its bandwidth: "
                + ("degraded?" if both else "waits on a slower hop or latency"),
            )
        )
    return out


def idle_chips(snap: Snapshot, chip_type: str = "gpu") -> list[Alert]:
    """A chip doing (almost) nothing while its peers of the same type are busy."""
    rows = snap.chips.get(chip_type, [])
    if len(rows) < 2:
        return []
    out = []
    for r in rows:
        peers = [p.utilization for p in rows if p.id != r.id]
        mean = float(np.mean(peers))
        if r.utilization <= IDLE and mean >= PEERS_BUSY:
            out.append(
                Alert(
                    "high",
                    f"idle-{chip_type}",
                    r.id,
                    f"{r.id} idle ({r.utilization:.0%}) while peers average {mean:.0%}",
                )
            )
    return out


def stragglers(snap: Snapshot) -> list[Alert]:
    """A chip much busier than its peers: in lockstep work the others wait for it."""
    out = []
    for chip_type, rows in snap.chips.items():
        if len(rows) < 3:
            continue
        med = float(np.median([r.utilization for r in rows]))
        for r in rows:
            if med >= 0.05 and r.utilization >= med + 0.25 and r.utilization >= 1.3 * med:
                out.append(
                    Alert(
                        "medium",
                        "straggler",
                        r.id,
                        f"{r.id} busy {r.utilization:.0%} vs {chip_type} median {med:.0%}",
                    )
                )
    return out


def dropped_spans(snap: Snapshot) -> list[Alert]:
    if snap.dropped:
        return [Alert("low", "spans-dropped", "feed", f"{snap.dropped:,} spans dropped")]
    return []


RULES: tuple[Callable[[Snapshot], list[Alert]], ...] = (
    saturated_links,
    idle_chips,
    stragglers,
    dropped_spans,
)
_RANK = {"high": 0, "medium": 1, "low": 2, "info": 3}


def from_findings(findings: list[Any]) -> list[Alert]:
    """Alerts from the analysis package's `Finding`s (rule, severity, culprit, suggestion)."""
    return [Alert(f.severity, f.rule, f.culprit, f.suggestion) for f in findings]


def merge(fast: list[Alert], deep: list[Alert]) -> list[Alert]:
    """Both lists, one alert per culprit (the analysis's word wins), most severe first."""
    seen = {a.culprit for a in deep}
    both = deep + [a for a in fast if a.culprit not in seen]
    return sorted(both, key=lambda a: (_RANK.get(a.severity, 9), a.rule, a.culprit))


def derive_alerts(snap: Snapshot) -> list[Alert]:
    """Every rule's alerts for the snapshot, most severe first."""
    if snap.empty:
        return []
    alerts = [a for rule in RULES for a in rule(snap)]
    return sorted(alerts, key=lambda a: (_RANK.get(a.severity, 9), a.rule, a.culprit))
