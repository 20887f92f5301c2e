"""Rules about launched device work (imported PyTorch profiler traces): exposed collective
communication, a GPU starved by its host's launches, and a rank the others wait for.

They read device spans on GPU/NPU chips per step and per chip: launch-bound needs spans
with a `launch` link (a kernel, copy or memset and the runtime call that queued it),
exposed-comm comm ops on the chips (collective kernels; the emulator's collectives are
link transfers, which poor-overlap judges), rank-straggler comm ops across ranks. Figures are per step of the workload,
over the sampled steps (`RuleInput.steps`), each chip on its own: communication on one GPU
is hidden only by compute on that GPU.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from typing import Any

from chiptrace.analysis import host_side as hs
from chiptrace.analysis.device_steps import comm_exposure, step_device
from chiptrace.analysis.findings import Finding
from chiptrace.analysis.host_side import ChipWait
from chiptrace.analysis.rule_input import RuleInput, ms
from chiptrace.analysis.tables import COMPUTE_TYPES

EXPOSED = 0.03  # communication with no compute under it, 3% of a step
HOST_WAIT = 0.05  # the GPU idle with an empty launch queue, 5% of a step
LONG_GAP = 1_000_000  # host waits averaging 1 ms are host work, not launch overhead
LAUNCH_SHARE = 0.5  # launch calls cover half the GPU's idle time: launch overhead
LATE = 0.02  # a rank the others wait for at collectives, 2% of a step
LAST_MOST = 0.5  # ... arriving last at half the collectives or more


def _t(ns: float) -> str:
    return f"{ns / 1e6:.3g} ms"


def _per_chip(x: RuleInput, fn: Any, launched: bool = True) -> dict[str, list[Any]]:
    """fn(ChipWork, StepDevice) per chip over the sampled steps: chips with launched work
    (else every chip with device work)."""
    out: dict[str, list[Any]] = defaultdict(list)
    for st in x.steps:
        sd = step_device(st)
        for chip, cw in sd.chips.items():
            if not launched or any(o[4] is not None for o in cw.ops):
                out[chip].append(fn(cw, sd))
    return out


def exposed_comm(x: RuleInput) -> list[Finding]:
    """Collective kernels (NCCL, RCCL) running while their GPU computes nothing."""
    # Any comm op on a GPU (an imported NCCL kernel, a replayed one, a decorated one).
    per = _per_chip(x, lambda cw, sd: (*comm_exposure(cw), sd.duration_ns), launched=False)
    rows = {c: v for c, v in per.items() if any(r[0] for r in v)}
    if not rows:
        return []
    step = statistics.median(r[4] for v in rows.values() for r in v)
    exposed = {c: statistics.fmean(r[1] for r in v) for c, v in rows.items()}
    comm = {c: statistics.fmean(r[0] for r in v) for c, v in rows.items()}
    # Hiding needs compute to hide behind: at most the compute not already under comm.
    hideable = {c: statistics.fmean(min(r[1], r[2]) for r in v) for c, v in rows.items()}
    worst = min(exposed, key=lambda c: (-exposed[c], c))
    if exposed[worst] < EXPOSED * step:
        return []
    names: dict[str, float] = defaultdict(float)
    for v in rows.values():
        for r in v:
            for n, t in r[3].items():
                names[n] += t
    culprit = min(names, key=lambda n: (-names[n], n))
    total_comm = sum(comm.values())
    overlap = 1 - sum(exposed.values()) / total_comm if total_comm else 0.0
    return [
        x.finding(
            "exposed-comm",
            culprit,
            {
                "comm_ms_per_step": ms(statistics.fmean(comm.values())),
                "exposed_ms_per_step": ms(statistics.fmean(exposed.values())),
                "overlap_pct": round(100 * overlap, 2),
                "worst_chip": worst,
                "worst_exposed_ms_per_step": ms(exposed[worst]),
                "exposed_ms_by_chip": {c: ms(v) for c, v in sorted(exposed.items())},
                "overlap_pct_by_chip": {
                    c: round(100 * (1 - exposed[c] / comm[c]), 2) if comm[c] else None
                    for c in sorted(comm)
                },
                "chips": len(rows),
                "steps_sampled": len(x.steps),
            },
            f"collectives run with nothing under them on their GPU ({_t(exposed[worst])} a "
            f"step on {worst}): overlap them with compute (bucketed gradient all-reduce during "
            f"backward, prefetching all-gathers), or shrink them (fewer, larger messages)",
            statistics.median(hideable.values()),
        )
    ]


def _launch_stats(x: RuleInput) -> dict[str, float]:
    """Median kernel time, launch call time and launch delay (device start minus the call's
    end) over the sampled steps' launched work, in ns."""
    kern, call, delay = [], [], []
    for st in x.steps:
        for cw in step_device(st).chips.values():
            for s, e, _k, _n, ls, le in cw.ops:
                if ls is not None and le is not None:
                    kern.append(e - s)
                    call.append(le - ls)
                    delay.append(s - le)
    if not kern:
        return {}
    return {
        "kernels": len(kern),
        "kernel": statistics.median(kern),
        "call": statistics.median(call),
        "delay": statistics.median(delay),
    }


def _launch_fix(st: dict[str, float], gap_ns: float) -> str:
    """What to try, from what the waits look like."""
    if st["kernel"] < st["call"]:
        return (
            "its kernels are shorter than the calls that launch them: fuse them "
            "(torch.compile) or replay the step as a CUDA graph"
        )
    if gap_ns >= LONG_GAP:
        return (
            "the host does other work between launches (data loading, CPU ops, syncs): "
            "overlap it with the GPU (DataLoader workers, pinned prefetch) or move it out of "
            "the step"
        )
    return "move Python and host work off the launching thread, or capture the step as a CUDA graph"


def launch_share(per: dict[str, list[ChipWait]]) -> float:
    """The share of the GPUs' idle time the host spent in the calls that launched work."""
    idle = sum(w.idle for v in per.values() for w in v)
    return sum(w.launch for v in per.values() for w in v) / idle if idle else 0.0


def launch_bound(x: RuleInput) -> list[Finding]:
    """The GPU idle because its host has not launched the next work yet (an empty launch
    queue), and the host spends that idle time launching: too many small kernels, launch
    overhead. (A host busy with other work is host-bound; one-time set-up is a warm-up.)"""
    per = hs.per_chip(x)
    if not per:
        return []
    steps = hs.steady_steps(x)
    step = statistics.median(steps)
    wait = hs.means(per, "wait")
    idle = hs.means(per, "idle")
    gaps = hs.means(per, "gaps")
    worst = min(wait, key=lambda c: (-wait[c], c))
    saving = statistics.median(wait.values())
    share = launch_share(per)
    if not step or saving < HOST_WAIT * step or share < LAUNCH_SHARE:
        return []
    st = _launch_stats(x)
    mean_gap = wait[worst] / max(gaps[worst], 1)
    return [
        x.finding(
            "launch-bound",
            worst,
            {
                "host_wait_ms_per_step": ms(saving),
                "worst_host_wait_ms_per_step": ms(wait[worst]),
                "host_wait_gaps_per_step": round(gaps[worst], 1),
                "mean_host_wait_us": round(mean_gap / 1e3, 3),
                "gpu_idle_ms_per_step": ms(statistics.median(idle.values())),
                "host_wait_share_of_idle": round(sum(wait.values()) / sum(idle.values()), 4)
                if sum(idle.values())
                else None,
                "launch_calls_share_of_idle": round(share, 4),
                "launches_per_step": round(st["kernels"] / max(len(x.steps), 1), 1),
                "kernel_us_p50": round(st["kernel"] / 1e3, 3),
                "launch_call_us_p50": round(st["call"] / 1e3, 3),
                "launch_delay_us_p50": round(st["delay"] / 1e3, 3),
                "chips": len(per),
                "steps_sampled": len(steps),
            },
            f"the GPU waits {_t(saving)} a step for its host to launch work, and the host "
            f"spends {share:.0%} of the GPU's idle time in launch calls: {_launch_fix(st, mean_gap)}",
            saving,
        )
    ]


def _chip_comm(x: RuleInput) -> bool:
    """Comm ops on GPU/NPU chips (collective kernels) in this workload: read off the
    tables, so a trace without them pays no scan."""
    return any(r["op_kind"] == "comm" and r["chip_type"] in COMPUTE_TYPES for r in x.chip_op_rows())


def _collectives(x: RuleInput) -> list[tuple[str, list[tuple[str, int, int]]]]:
    """Per collective seen on every rank of a step: its trace, and (chip, start, end) of
    each rank's kernel. The k-th comm kernel of each chip in a step's trace, where every chip has one
    of the same name and they end together (a collective ends on all ranks at once;
    point-to-point sends end apart and are left out)."""
    if x.con is None or x.tables.steps.num_rows < 2 or not _chip_comm(x):
        return []
    traces = sorted(set(x.tables.steps.column("trace_id").to_pylist()))[:256]
    ids = ", ".join(f"unhex('{t}')" for t in traces)
    rows = x.con.sql(
        f"""SELECT lower(hex(trace_id)), CAST(chip_id AS VARCHAR), CAST(name AS VARCHAR),
                   start_ns, end_ns,
                   row_number() OVER (PARTITION BY trace_id, chip_id ORDER BY start_ns, end_ns)
            FROM spans_raw
            WHERE op_kind = 'comm' AND chip_type IN ('gpu', 'npu') AND trace_id IN ({ids})
              AND end_ns > {x.tables.lo} AND start_ns < {x.tables.hi}"""
    ).fetchall()
    chips: dict[str, set[str]] = defaultdict(set)
    groups: dict[tuple[str, int], list[tuple[str, str, int, int]]] = defaultdict(list)
    for trace, chip, name, s, e, k in rows:
        chips[trace].add(chip)
        groups[(trace, k)].append((chip, name, s, e))
    out = []
    for (trace, _k), g in groups.items():
        if len(g) < 2 or len(g) != len(chips[trace]) or len({n for _, n, _, _ in g}) != 1:
            continue
        ends = [e for *_, e in g]
        shortest = min(e - s for _, _, s, e in g)
        if max(ends) - min(ends) <= max(50_000, shortest // 20):
            out.append((trace, [(c, s, e) for c, _, s, e in g]))
    return out


def rank_straggler(x: RuleInput) -> list[Finding]:
    """A rank the others wait for: it arrives last at the step's collectives, so theirs
    run longer (waiting) while its own are short."""
    colls = _collectives(x)
    if not colls:
        return []
    late: dict[str, float] = defaultdict(float)
    last: dict[str, int] = defaultdict(int)
    waits: dict[str, float] = defaultdict(float)
    comm: dict[str, float] = defaultdict(float)
    for _, c in colls:
        order = sorted(c, key=lambda r: (r[1], r[0]))
        top = order[-1][1]
        late[order[-1][0]] += top - order[-2][1]  # what the others would not have waited
        last[order[-1][0]] += 1
        for chip, s, e in c:
            waits[chip] += top - s
            comm[chip] += e - s
    n_steps = len({t for t, _ in colls})  # steps (traces) with collectives on every rank
    chip = min(late, key=lambda k: (-late[k], k))
    per_step = late[chip] / n_steps
    share_last = last[chip] / len(colls)
    if per_step < LATE * x.step_ns or share_last < LAST_MOST:
        return []
    others = [c for c in waits if c != chip]
    return [
        x.finding(
            "rank-straggler",
            chip,
            {
                "collectives": len(colls),
                "last_to_arrive": last[chip],
                "others_waited_ms_per_step": ms(per_step),
                "its_comm_ms_per_step": ms(comm[chip] / n_steps),
                "others_comm_ms_per_step": ms(statistics.median(comm[c] for c in others) / n_steps),
                "others_wait_ms_per_step": {c: ms(waits[c] / n_steps) for c in sorted(others)},
                "ranks": len(waits),
            },
            f"{chip} reaches {last[chip]} of {len(colls)} collectives last, and the other ranks "
            f"wait {_t(per_step)} a step for it: look at what it does before them (its data, "
            f"its share of the model, a slower GPU or host)",
            per_step,
        )
    ]
