"""What a fix would save per step, read off the sampled steps' critical paths.

A fault on a link or in a collective slows some transfers; whether that slows the step
depends on whether they sit on the critical path (an all-reduce hidden behind backward
costs nothing). So the saving of a slow or rerouted link is the critical path's time in
transfers beyond what the same transfers (same name and size, the other flows of the
collective round) take elsewhere in the step; at most the time those slowed transfers run
while the GPUs/NPUs compute nothing (a faster all-reduce still waits for backward).
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from typing import Any

from chiptrace.analysis import steps as iv
from chiptrace.analysis.rule_input import RuleInput
from chiptrace.analysis.steps import Step
from chiptrace.analysis.tables import COMPUTE_TYPES

SLOWER = 1.5  # a transfer 1.5x the step's typical for its name and size is slowed


def _typical(spans: tuple[dict[str, Any], ...]) -> dict[tuple[Any, Any], float]:
    durs: dict[tuple[Any, Any], list[int]] = defaultdict(list)
    for s in spans:
        if s["link_id"] and s["end_ns"] > s["start_ns"]:
            durs[(s["name"], s["op_bytes"])].append(s["end_ns"] - s["start_ns"])
    return {k: statistics.median(v) for k, v in durs.items()}


def _exposed(st: Step, slowed: list[dict[str, Any]]) -> int:
    """Time the slowed transfers run while no GPU/NPU computes."""
    compute = st.busy(
        s
        for s in st.leaves()
        if s["chip_type"] in COMPUTE_TYPES and s["op_kind"] in (None, "compute", "memcpy")
    )
    return iv.length(iv.subtract(st.busy(slowed), compute))


def slowed_transfers_on_path(x: RuleInput) -> float | None:
    """Per step (mean over the sampled steps): critical-path time in slowed transfers
    beyond their typical duration, capped by the time they are exposed (no compute under
    them); None without sampled steps."""
    if not x.steps or not x.paths:
        return None
    total = 0.0
    for st, path in zip(x.steps, x.paths, strict=False):
        typical = _typical(st.spans)
        slowed = [
            s
            for s in st.spans
            if s["link_id"]
            and s["end_ns"] - s["start_ns"]
            > SLOWER * typical.get((s["name"], s["op_bytes"]), s["end_ns"] - s["start_ns"])
        ]
        if not slowed:
            continue
        by_id = {s["span_id"]: s for s in slowed}
        on_path = 0.0
        for seg in path.segments:
            s = by_id.get(seg.span_id or "")
            if s is not None:
                typ = typical[(s["name"], s["op_bytes"])]
                on_path += seg.on_path_ns * (1 - typ / (s["end_ns"] - s["start_ns"]))
        total += min(on_path, _exposed(st, slowed))
    return total / len(x.paths)
