"""What the host does while a GPU waits for it, per sampled step: the figures behind
launch-bound (the waits are launch calls), host-bound and data-loading (the waits are other
host work), and warm-up (one-time work: allocation, compilation).

A GPU's idle time in a step is the gaps between its merged work; HolisticTraceAnalysis's
host wait is the part of each gap before the work ending it was launched
(`device_steps.host_wait`). What covers the idle time on the host says which fix helps:
runtime launch calls (fewer, fused kernels or a CUDA graph), top-level host work of the
step such as backward, the optimizer or `DataLoader.__next__` (overlap it with the GPU),
or one-time calls such as cudaMalloc/cudaFree and compilation (a warm-up: leave it out).
"""

from __future__ import annotations

import re
import secrets
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from chiptrace.analysis import steps as iv
from chiptrace.analysis.device_steps import host_wait, step_device
from chiptrace.analysis.rule_input import RuleInput
from chiptrace.analysis.steps import Step
from chiptrace.analysis.tables import COMPUTE_TYPES
from chiptrace.analysis.workloads import family

# Calls a run makes once, at start-up: allocation, device and stream set-up, module loads,
# graph instantiation, and the compiler's own work (not running compiled code: a steady
# step under torch.compile has its "Torch-Compiled Region" and "CompiledFunction" too).
ONE_TIME = re.compile(
    r"^(cuda|hip|cu)(Malloc|Free|HostAlloc|HostRegister|HostFree|StreamCreate|EventCreate|"
    r"DeviceGetStreamPriorityRange|GetDeviceProperties|SetDevice|Init|ModuleLoad|"
    r"DeviceSetLimit|GraphInstantiate|DeviceGetAttribute|FuncGetAttributes)"
    r"|compile_inner|call_user_compiler|compile_fx|async_compile|triton[._ ]compile"
    r"|CachingAutotuner|autotune",
    re.I,
)
DATA_LOADING = re.compile(r"DataLoader|_next_data|dataloader|data_loader|fetch_batch")
UNTRACED = "(untraced host time)"
WARM_UP = 0.5  # one-time work covering half a step (or half its GPU's idle time)


@dataclass
class ChipWait:
    """One GPU's waits in one step (ns): idle, host wait (HTA), idle covered by launch
    calls, by one-time calls, and by each top-level host span name; busy."""

    idle: int = 0
    wait: int = 0
    gaps: int = 0
    launch: int = 0
    once: int = 0
    busy: int = 0
    by_name: dict[str, int] = field(default_factory=dict)


@dataclass
class StepHost:
    """A step's GPUs' waits, and whether one-time work dominates it (a warm-up)."""

    step: Step
    duration_ns: int
    chips: dict[str, ChipWait]
    once_ns: int  # one-time calls in the step (union)
    once_names: dict[str, int]

    @property
    def warm_up(self) -> bool:
        idle = sum(c.idle for c in self.chips.values())
        once_idle = sum(c.once for c in self.chips.values())
        return self.once_ns >= WARM_UP * self.duration_ns or (
            idle > 0 and once_idle >= WARM_UP * idle
        )


def _top_level(st: Step) -> dict[str, list[iv.Interval]]:
    """The step's own host work by name: spans right under its root on a host (not
    launch calls, not device work), as merged intervals."""
    out: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for s in st.spans:
        if (s["parent_span_id"] or "") != st.root_id or s["op_kind"] == "launch":
            continue
        if s["chip_type"] in COMPUTE_TYPES or s["link_id"]:
            continue
        if s["start_ns"] <= st.start_ns and s["end_ns"] >= st.end_ns:
            continue  # a span around the whole step (the profiler's own range) is not its work
        out[family(s["name"] or "")].append((s["start_ns"], s["end_ns"]))
    return {k: iv.union(v) for k, v in out.items()}


def _gaps(busy: list[iv.Interval]) -> list[iv.Interval]:
    return [(b, c) for (_a, b), (c, _d) in zip(busy, busy[1:], strict=False) if c > b]


def _lead_in(cw: Any, start: int, prev_end: int | None) -> tuple[list[iv.Interval], int]:
    """The GPU's idle time before its first work in the step (once earlier work it was
    still running has ended), and the host wait in it: until the first work's launch."""
    busy = cw.busy()
    if not busy:
        return [], 0
    a = max(start, prev_end or start)
    first = busy[0][0]
    if first <= a:
        return [], 0
    launches = [ls for s0, _e, _k, _n, ls, _le in cw.ops if s0 == first and ls is not None]
    wait = min(min(launches), first) - a if launches and min(launches) > a else 0
    return [(a, first)], wait


def step_host(st: Step, prev_end: dict[str, int] | None = None) -> StepHost:
    """The figures of one step (see the module docstring); `prev_end`: per GPU, the end
    of earlier work still running at the step's start (its idle time starts after it)."""
    sd = step_device(st)
    calls = iv.union(
        (ca, cb)
        for cw in sd.chips.values()
        for *_, ca, cb in cw.ops
        if ca is not None and cb is not None
    )
    once_spans = [
        s for s in st.spans if s["op_kind"] == "launch" or s["chip_type"] not in COMPUTE_TYPES
    ]
    once_spans = [s for s in once_spans if ONE_TIME.search(s["name"] or "")]
    once = st.busy(once_spans)
    names: dict[str, int] = defaultdict(int)
    for s in once_spans:
        names[s["name"]] += iv.length(iv.intersect(st.busy([s]), once))
    top = _top_level(st)
    # idle time under no host span at all (the root aside): Python the profiler did not
    # record, or the host blocked outside the trace
    traced = st.busy(
        s
        for s in st.spans
        if s["span_id"] != st.root_id and s["chip_type"] not in COMPUTE_TYPES and not s["link_id"]
    )
    chips = {}
    for chip, cw in sd.chips.items():
        if not any(o[4] is not None for o in cw.ops):
            continue
        busy = cw.busy()
        lead, lead_wait = _lead_in(cw, st.start_ns, (prev_end or {}).get(chip))
        idle = lead + _gaps(busy)
        w = ChipWait(busy=iv.length(busy))
        w.idle, w.wait, w.gaps = host_wait(cw)
        w.idle += iv.length(lead)
        w.wait += lead_wait
        w.gaps += 1 if lead_wait else 0
        w.launch = iv.length(iv.intersect(idle, calls))
        w.once = iv.length(iv.intersect(idle, once))
        w.by_name = {n: iv.length(iv.intersect(idle, ivs)) for n, ivs in top.items()}
        w.by_name[UNTRACED] = iv.length(iv.subtract(idle, traced))
        chips[chip] = w
    return StepHost(st, sd.duration_ns, chips, iv.length(once), dict(names))


_PREV_SQL = """
SELECT s.i, CAST(d.chip_id AS VARCHAR), max(d.end_ns)
FROM spans_raw d JOIN {starts} s
  ON d.start_ns < s.t AND d.end_ns > s.t AND d.start_ns >= s.t - {reach}
WHERE d.chip_type IN ('gpu', 'npu') AND d.start_ns >= {lo}
GROUP BY ALL"""
PREV_REACH_NS = 60_000_000_000  # device work running into a step started at most 60 s before


def _prev_ends(x: RuleInput) -> list[dict[str, int]]:
    """Per sampled step, per GPU/NPU: the end of device work that started before the step
    and was still running at its start (a GPU behind its host). One query."""
    out: list[dict[str, int]] = [{} for _ in x.steps]
    launched = any(
        '"launch"' in (sp["links"] or "")
        for st in x.steps
        for sp in st.spans
        if sp["chip_type"] in COMPUTE_TYPES
    )
    if x.con is None or not launched:  # no launched device work: nothing to wait for
        return out
    # work still running at a step's start began at most a few steps before it
    reach = min(PREV_REACH_NS, 4 * max(st.duration_ns for st in x.steps))
    starts = pa.table(
        {"i": list(range(len(x.steps))), "t": [st.start_ns for st in x.steps]},
        schema=pa.schema([("i", pa.int64()), ("t", pa.int64())]),
    )
    name = f"_ct_starts_{secrets.token_hex(4)}"
    x.con.register(name, starts)
    try:
        lo = min(st.start_ns for st in x.steps) - reach
        q = _PREV_SQL.format(starts=name, reach=reach, lo=lo)
        for i, chip, end in x.con.sql(q).fetchall():
            out[int(i)][chip] = int(end)
    finally:
        x.con.unregister(name)
    return out


def step_hosts(x: RuleInput) -> list[StepHost]:
    """`step_host` of every sampled step, computed once per input."""
    if "step_hosts" not in x.memo:
        if x.training and x.steps:
            prev = _prev_ends(x)
            x.memo["step_hosts"] = [step_host(st, p) for st, p in zip(x.steps, prev, strict=True)]
        else:
            x.memo["step_hosts"] = []
    out: list[StepHost] = x.memo["step_hosts"]
    return out


def per_chip(x: RuleInput) -> dict[str, list[ChipWait]]:
    """Each GPU's waits over the sampled steps that are not warm-ups."""
    out: dict[str, list[ChipWait]] = defaultdict(list)
    for sh in step_hosts(x):
        if sh.warm_up:
            continue
        for chip, w in sh.chips.items():
            out[chip].append(w)
    return out


def mean(v: list[ChipWait], key: str) -> float:
    return sum(float(getattr(w, key)) for w in v) / max(len(v), 1)


def means(per: dict[str, list[ChipWait]], key: str) -> dict[str, float]:
    """Per chip, one ChipWait figure's mean over its sampled steps."""
    return {c: mean(v, key) for c, v in per.items()}


def steady_steps(x: RuleInput) -> list[int]:
    """The sampled steps' durations, warm-ups left out."""
    return [sh.duration_ns for sh in step_hosts(x) if not sh.warm_up]


def names_covering(v: list[ChipWait]) -> dict[str, float]:
    """Per top-level host span name: the idle time it covers, per step."""
    out: dict[str, float] = defaultdict(float)
    for w in v:
        for n, t in w.by_name.items():
            out[n] += t / len(v)
    return dict(out)


def describe(v: dict[str, Any]) -> str:
    """The top three names of a {name: ns} dict, as text."""
    top = sorted(v.items(), key=lambda kv: (-kv[1], kv[0]))[:3]
    return ", ".join(f"{n} {t / 1e6:.3g} ms" for n, t in top)
