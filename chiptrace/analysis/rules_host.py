"""Rules about a GPU waiting on its host's own work (figures from `host_side`):
host-bound (backward, the optimizer, Python ops run while the GPU idles), data-loading
(the same, when the host is fetching the next batch), and warm-up (a step spent on
one-time work, which no rule about steady steps should judge)."""

from __future__ import annotations

import statistics

from chiptrace.analysis import host_side as hs
from chiptrace.analysis.findings import Finding
from chiptrace.analysis.rule_input import RuleInput, ms
from chiptrace.analysis.rules_device import HOST_WAIT, LAUNCH_SHARE, launch_share


def host_bound(x: RuleInput) -> list[Finding]:
    """The GPU waits for its host (HolisticTraceAnalysis's host wait, >= 5% of a step)
    while the host does the step's own work, not launch calls: name the host work that
    covers the most idle time. Overlapping it with the GPU saves at most the GPU's own
    work per step, so a GPU that barely works (a toy, a CPU program) costs little."""
    per = hs.per_chip(x)
    if not per:
        return []
    steps = hs.steady_steps(x)
    step = statistics.median(steps)
    wait = hs.means(per, "wait")
    busy = hs.means(per, "busy")
    idle = hs.means(per, "idle")
    share = launch_share(per)
    med_wait = statistics.median(wait.values())
    if not step or med_wait < HOST_WAIT * step or share >= LAUNCH_SHARE:
        return []
    worst = min(wait, key=lambda c: (-wait[c], c))
    names = hs.names_covering(per[worst])
    if not names or max(names.values()) <= 0:
        return []
    culprit = min(names, key=lambda n: (-names[n], n))
    loading = bool(hs.DATA_LOADING.search(culprit))
    saving = statistics.median(min(wait[c], busy[c]) for c in per)
    rule = "data-loading" if loading else "host-bound"
    fix = (
        "load batches ahead of the GPU: DataLoader(num_workers>0, pin_memory=True, "
        "prefetch_factor), and keep decoding/augmentation off the training thread"
        if loading
        else "overlap it with the GPU (start the next work earlier, move it to another "
        "thread or stream), or make it cheaper (fused optimizer, fewer Python ops, "
        "torch.compile)"
    )
    return [
        x.finding(
            rule,
            culprit,
            {
                "gpu_idle_ms_per_step": ms(statistics.median(idle.values())),
                "host_wait_ms_per_step": ms(med_wait),
                "gpu_busy_ms_per_step": ms(statistics.median(busy.values())),
                "idle_covered_ms_by": {
                    n: ms(t) for n, t in sorted(names.items(), key=lambda kv: -kv[1])[:5]
                },
                "launch_calls_share_of_idle": round(share, 4),
                "worst_chip": worst,
                "chips": len(per),
                "steps_sampled": len(steps),
            },
            f"{worst} is idle {idle[worst] / 1e6:.3g} ms a step waiting on its host, which "
            f"runs {hs.describe(names)} meanwhile: {fix}",
            saving,
        )
    ]


def warm_up(x: RuleInput) -> list[Finding]:
    """Sampled steps dominated by one-time work (cudaMalloc/cudaFree, stream set-up,
    compilation): named as warm-up, at info severity, and left out of the rules about
    steady steps (launch-bound, host-bound, step-outliers)."""
    warm = [sh for sh in hs.step_hosts(x) if sh.warm_up]
    if not warm:
        return []
    names: dict[str, float] = {}
    for sh in warm:
        for n, t in sh.once_names.items():
            names[n] = names.get(n, 0.0) + t
    first = min(warm, key=lambda sh: sh.step.start_ns)
    f = x.finding(
        "warm-up",
        first.step.name,
        {
            "warm_up_steps": len(warm),
            "steps_sampled": len(hs.step_hosts(x)),
            "step_ms": ms(first.duration_ns),
            "one_time_ms": ms(first.once_ns),
            "one_time_ms_by_call": {
                n: ms(t) for n, t in sorted(names.items(), key=lambda kv: -kv[1])[:5]
            },
        },
        f"{first.step.name} is a warm-up: one-time work ({hs.describe(names)}) fills it; "
        f"profile steady steps (skip the first ones: torch.profiler.schedule(wait=1, "
        f"warmup=1, ...)) to judge the loop",
        0.0,
        "info",
    )
    return [f]
