"""Rules about chips: straggler, load imbalance, starvation.

Each rule is a pure function `rule(x: RuleInput) -> list[Finding]` over one workload.
Thresholds are module constants so a reader sees what "stands out" means; each finding
states what fixing it would save per step of the workload (`RuleInput.finding`).
"""

from __future__ import annotations

import functools
import statistics
from collections import defaultdict

from chiptrace.analysis import steps as iv
from chiptrace.analysis.model import Finding, severity_for
from chiptrace.analysis.rule_input import RuleInput, ms, robust_z
from chiptrace.analysis.tables import COMPUTE_TYPES, HOST_TYPES
from chiptrace.analysis.workloads import family

ROBUST_Z = 3.5  # the usual cut for the modified z-score (Iglewicz and Hoaglin)
Z_FLOOR = 0.005  # spread assumed at least 0.5% of a step (identical peers have MAD 0)
MIN_EXCESS = 0.02  # a straggler must cost at least 2% of a step
IMBALANCE = 0.20  # busiest chip 20% above its group's mean
CONSISTENT = 0.8  # ... and busier than its peers in 80% of the windows where they differ
MIN_WINDOWS = 6
STARVED = 0.05  # compute idle while the host works, 5% of a step


def peer_group(x: RuleInput, chip_id: str, chip_type: str) -> tuple[str, str | None]:
    """Chips compared with each other: the same type and, where the topology says, model."""
    return (chip_type, x.tables.topology.model(chip_id))


def straggler(x: RuleInput) -> list[Finding]:
    """A chip whose per-step busy time, start or finish stands out among its type."""
    t = x.tables
    starts = dict(
        zip(
            t.steps.column("span_id").to_pylist(),
            t.steps.column("start_ns").to_pylist(),
            strict=True,
        )
    )
    per: dict[tuple[tuple, str], dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for r in t.step_chips.to_pylist():
        s0 = starts.get(r["step_id"])
        if s0 is None:
            continue
        d = per[(peer_group(x, r["chip_id"], r["chip_type"]), r["chip_id"])]
        d["busy per step"].append(r["op_ns"])
        d["start offset"].append(r["first_ns"] - s0)
        d["finish offset"].append(r["last_ns"] - s0)
    by_type: dict[tuple, dict[str, dict[str, float]]] = defaultdict(dict)
    for (group, chip), stats in per.items():
        by_type[group][chip] = {k: statistics.median(v) for k, v in stats.items()}
    out = []
    for (ctype, _model), chips in by_type.items():
        if len(chips) < 3:
            continue
        best: tuple[float, str, str, float, float, float] | None = None
        for stat in ("busy per step", "start offset", "finish offset"):
            vals = [c[stat] for c in chips.values()]
            med = statistics.median(vals)
            for chip, c in chips.items():
                excess = c[stat] - med
                z = robust_z(c[stat], vals, Z_FLOOR * x.step_ns)
                if z >= ROBUST_Z and excess >= MIN_EXCESS * x.step_ns:
                    if best is None or excess > best[0]:
                        best = (excess, chip, stat, c[stat], med, z)
        if best is None:
            continue
        excess, chip, stat, val, med, z = best
        steps_used = len(per[(peer_group(x, chip, ctype), chip)]["busy per step"])
        out.append(
            x.finding(
                "straggler",
                chip,
                {
                    "statistic": stat,
                    "chip_ms": ms(val),
                    "peer_median_ms": ms(med),
                    "excess_ms": ms(excess),
                    "robust_z": round(z, 2),
                    "chip_type": ctype,
                    "chips_compared": len(chips),
                    "steps_compared": steps_used,
                },
                f"{chip} {'works longer' if stat == 'busy per step' else 'runs late'} than the other "
                f"{ctype}s every step: check its clocks/thermals, its data feed, or rebalance its share",
                excess,  # the step waits for its slowest chip: that much per step
            )
        )
    return out


def _work(x: RuleInput) -> dict[str, str]:
    """Each chip's main work: the op name (layer numbers dropped) it spends most time in."""
    per: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for r in x.chip_op_rows():
        per[r["chip_id"]][family(r["name"] or "")] += r["op_ns"] or 0
    return {c: max(d, key=lambda k: (d[k], k)) for c, d in per.items()}


def _consistency(x: RuleInput, top: str, peers: list[str]) -> tuple[int, int]:
    """Windows where `top` was busier / less busy than its peers' mean (ties left out):
    random batch sizes make one of two chips the busier overall half the time, a real
    imbalance makes it the busier one in nearly every window."""
    t = x.tables
    busy: dict[int, dict[str, float]] = defaultdict(dict)
    for r in t.util.to_pylist():
        if r["chip_id"] in peers or r["chip_id"] == top:
            busy[r["window_index"]][r["chip_id"]] = r["busy_ns"]
    wins = losses = 0
    for b in busy.values():
        mine = b.get(top, 0.0)
        others = statistics.fmean(b.get(p, 0.0) for p in peers)
        if abs(mine - others) <= 0.01 * t.window_ns:
            continue
        wins, losses = (wins + 1, losses) if mine > others else (wins, losses + 1)
    return wins, losses


def load_imbalance(x: RuleInput, skip: frozenset[str] | set[str] = frozenset()) -> list[Finding]:
    """Busy time spread unevenly over chips of one model doing the same work (not a single
    straggler, which `straggler` names)."""
    t = x.tables
    work = _work(x)
    groups: dict[tuple, dict[str, int]] = defaultdict(dict)
    for r in x.chip_rows():
        key = (*peer_group(x, r["chip_id"], r["chip_type"]), work.get(r["chip_id"]))
        groups[key][r["chip_id"]] = r["busy_ns"]
    out = []
    for (ctype, model, kind), chips in groups.items():
        if len(chips) < 2:
            continue
        mean = statistics.fmean(chips.values())
        top = min(chips, key=lambda c: (-chips[c], c))
        low = min(chips, key=lambda c: (chips[c], c))
        if mean <= 0 or top in skip or chips[top] / mean - 1 < IMBALANCE:
            continue
        wins, losses = _consistency(x, top, [c for c in chips if c != top])
        if wins + losses < MIN_WINDOWS or wins < CONSISTENT * (wins + losses):
            continue
        imb = chips[top] / mean - 1
        out.append(
            x.finding(
                "load-imbalance",
                top,
                {
                    "chip_type": ctype,
                    "model": model,
                    "work": kind,
                    "busiest": top,
                    "busiest_util": round(chips[top] / t.wall_ns, 4),
                    "idlest": low,
                    "idlest_util": round(chips[low] / t.wall_ns, 4),
                    "mean_util": round(mean / t.wall_ns, 4),
                    "imbalance": round(imb, 4),
                    "chips": len(chips),
                    "windows_busier": wins,
                    "windows_less_busy": losses,
                },
                f"spread work across the {len(chips)} {ctype}s doing {kind} (dynamic scheduling, "
                f"or re-shard: {top} is {imb:.0%} above the mean)",
                (chips[top] - mean) / x.n_steps,
            )
        )
    return out


def _fabric(s: dict) -> bool:
    """A span keeping a GPU/NPU side busy: work on one, a collective transfer (`op.kind`
    comm, whatever route it took), or a transfer between two."""
    return _fabric_key(s["chip_type"], s["link_id"], s["link_src"], s["link_dst"], s["op_kind"])


@functools.lru_cache(maxsize=65536)
def _fabric_key(
    chip_type: str | None, link: str | None, src: str | None, dst: str | None, kind: str | None
) -> bool:
    # Cached: a step has 100,000s of spans but only a few hundred distinct chips and links.
    if chip_type in COMPUTE_TYPES:
        return True
    if link and kind == "comm":
        return True
    ends = [(e or "").rsplit("/", 1)[-1].split(":")[0] for e in (src, dst)]
    return bool(link) and all(e in (*COMPUTE_TYPES, "switch") for e in ends)


def _host_key(s: dict) -> str | None:
    if s["chip_type"] in (*HOST_TYPES, "nic"):
        return s["chip_id"]
    if s["link_id"] and not _fabric(s):
        return s["link_id"]
    return None


def starvation(x: RuleInput) -> list[Finding]:
    """GPUs/NPUs idle while the host side (CPU, DPU, NIC, host links) is busy."""
    if not x.steps:
        return []
    totals: dict[str, float] = defaultdict(float)
    idle_total = step_total = 0.0
    for st in x.steps:
        leaves = [s for s in st.leaves() if s["end_ns"] > s["start_ns"]]
        if not any(s["chip_type"] in COMPUTE_TYPES for s in leaves):
            continue
        busy = iv.union(st.clip(s) for s in leaves if _fabric(s))
        idle = iv.subtract([(st.start_ns, st.end_ns)], busy)
        idle_total += iv.length(idle)
        step_total += st.duration_ns
        hosts: dict[str, list] = defaultdict(list)
        for s in leaves:
            key = _host_key(s)
            if key:
                hosts[key].append(st.clip(s))
        for key, ivs in hosts.items():
            totals[key] += iv.length(iv.intersect(iv.union(ivs), idle))
    if not totals or step_total <= 0:
        return []
    culprit = min(totals, key=lambda k: (-totals[k], k))
    share = totals[culprit] / step_total
    if share < STARVED:
        return []
    return [
        x.finding(
            "starvation",
            culprit,
            {
                "compute_idle_share": round(idle_total / step_total, 4),
                "culprit_busy_while_idle_share": round(share, 4),
                "steps_sampled": len(x.steps),
            },
            f"GPUs/NPUs wait {share:.0%} of a step while {culprit} works: overlap it with compute "
            f"(prefetch, more workers, offload) or give it more capacity",
            totals[culprit] / len(x.steps),
            # Some serial input work is normal; a quarter of every step is not.
            severity_for(share, high=0.25, medium=0.08),
        )
    ]
