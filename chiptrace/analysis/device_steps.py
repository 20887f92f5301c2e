"""Device work of a sampled step, chip by chip: what the rules about launched work read.

An imported PyTorch profiler step holds host calls and the device work they launched (a
span with a `launch` link to its runtime call). The GPU may run behind the CPU, so a step's
device window is its start to the end of the last device work it launched, not its host
span's end. Everything here is plain interval arithmetic over one step's spans (Step).
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from chiptrace.analysis import steps as iv
from chiptrace.analysis.steps import Interval, Step
from chiptrace.analysis.tables import COMPUTE_TYPES

WORK_KINDS = ("compute", "comm", "memcpy", "memset")  # device time that is work (not syncs)


def launch_of(span: dict[str, Any]) -> str | None:
    """The span id of the call that launched `span` (its `launch` link), else None."""
    raw = span.get("links")
    if not raw or "launch" not in raw:
        return None
    try:
        items = json.loads(raw)
    except (TypeError, ValueError):
        return None
    for it in items if isinstance(items, list) else []:
        if isinstance(it, dict) and (it.get("attributes") or {}).get("kind") == "launch":
            sid = it.get("span_id")
            return str(sid).lower() if sid else None
    return None


@dataclass
class ChipWork:
    """One chip's device work in one step.

    Attributes:
        ops: (start, end, op_kind, name, launch start, launch end) per device span; the
            launch times are None for work without a launching call in the step.
    """

    chip_id: str
    ops: list[tuple[int, int, str, str, int | None, int | None]] = field(default_factory=list)

    def busy(self, kinds: tuple[str, ...] = WORK_KINDS) -> list[Interval]:
        """The union of the chip's work of these kinds."""
        return iv.union((s, e) for s, e, k, *_ in self.ops if k in kinds)


@dataclass
class StepDevice:
    """A step's device work per chip, and its device window."""

    step: Step
    start_ns: int
    end_ns: int
    chips: dict[str, ChipWork]

    @property
    def duration_ns(self) -> int:
        return self.end_ns - self.start_ns


def step_device(st: Step) -> StepDevice:
    """Group a step's device leaves by chip, each with its launching call's times; the
    window runs from the step's start to the end of the last device work it launched."""
    by_id = {s["span_id"]: s for s in st.spans}
    chips: dict[str, ChipWork] = defaultdict(lambda: ChipWork(""))
    end = st.end_ns
    for s in st.leaves():
        if s["chip_type"] not in COMPUTE_TYPES or s["end_ns"] <= s["start_ns"]:
            continue
        lid = launch_of(s)
        call = by_id.get(lid) if lid else None
        if lid:
            end = max(end, s["end_ns"])
        cw = chips[s["chip_id"]]
        cw.chip_id = s["chip_id"]
        cw.ops.append(
            (
                max(s["start_ns"], st.start_ns),
                s["end_ns"],
                s["op_kind"] or "compute",
                s["name"] or "",
                None if call is None else call["start_ns"],
                None if call is None else call["end_ns"],
            )
        )
    for cw in chips.values():
        cw.ops = [
            (a, min(b, end), kind, name, ca, cb)
            for a, b, kind, name, ca, cb in cw.ops
            if min(b, end) > a
        ]
        cw.ops.sort()
    return StepDevice(st, st.start_ns, end, dict(chips))


def host_wait(cw: ChipWork) -> tuple[int, int, int]:
    """(idle, host-wait, host-wait gaps) of a chip between its first and last work in a
    step (ns, ns, count).

    The chip is idle between merged busy intervals. An idle gap waits for the host while
    the work that ends it has not been launched yet: from the gap's start to the start of
    the runtime call that launched it (its launch queue was empty: HolisticTraceAnalysis's
    "host wait", which counts the whole gap; the rest of the gap the work sat queued behind
    something else, an event, another stream or rank, and a faster host would not help).
    """
    busy = cw.busy()
    starts: dict[int, int] = {}  # the earliest known launch of the work starting at s
    for s, _e, k, _n, ls, _le in cw.ops:
        if k in WORK_KINDS and ls is not None:
            starts[s] = min(starts.get(s, ls), ls)
    idle = hw = gaps = 0
    for (_a, b), (c, _d) in zip(busy, busy[1:], strict=False):
        idle += c - b
        launch = starts.get(c)
        if launch is not None and launch > b:
            hw += min(launch, c) - b
            gaps += 1
    return idle, hw, gaps


def comm_exposure(cw: ChipWork) -> tuple[int, int, int, dict[str, int]]:
    """(comm, exposed comm, compute not overlapping comm) ns of a chip, and the exposed ns
    per comm op name. Exposed: communication while no compute runs on the same chip."""
    comm = cw.busy(("comm",))
    compute = cw.busy(("compute",))
    exposed = iv.subtract(comm, compute)
    free = iv.subtract(compute, comm)
    per: dict[str, int] = defaultdict(int)
    for s, e, k, name, *_ in cw.ops:
        if k == "comm":
            per[name] += iv.length(iv.intersect([(s, e)], exposed))
    return iv.length(comm), iv.length(exposed), iv.length(free), dict(per)
