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
from chiptrace.analysis.findings import Finding, severity_for
from chiptrace.analysis.rule_input import RuleInput, ms, rank_z, robust_z
from chiptrace.analysis.tables import COMPUTE_TYPES, HOST_TYPES
from chiptrace.analysis.workloads import family

ROBUST_Z = 3.5  # the usual cut for the modified z-score (Iglewicz and Hoaglin)
RANK_Z = 4.0  # rank-sum z a chip's requests must reach against the others' (8 chips, 3 stats)
Z_FLOOR = 0.005  # spread assumed at least 0.5% of a step (identical peers have MAD 0)
MIN_EXCESS = 0.02  # a straggler must cost at least 2% of a step
IMBALANCE = 0.20  # busiest chip 20% above its group's mean
CONSISTENT = 0.8  # ... and busier than its peers in 80% of the windows where they differ
MIN_WINDOWS = 6
STARVED = 0.05  # compute idle while the host works, 5% of a step


def peer_group(x: RuleInput, chip_id: str, chip_type: str) -> tuple[str, str | None]:
    """Chips compared with each other: the same type and, where the topology says, model."""
    return (chip_type, x.tables.topology.model(chip_id))


Samples = dict[str, dict[str, list[float]]]  # chip -> statistic -> one value per step


def _samples(x: RuleInput) -> dict[tuple, Samples]:
    """Per peer group and chip: busy time, first-op and last-op offset of every step, each
    against the start of the chip's own step (its rank's: steps are per process). Busy
    time leaves out comm ops on the chip: a collective kernel runs until the last rank
    arrives, so the earliest rank's is longest, and that is waiting, not work."""
    t = x.tables
    starts = dict(zip(t.steps["span_id"].to_pylist(), t.steps["start_ns"].to_pylist()))
    out: dict[tuple, Samples] = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))
    for r in t.step_chips.to_pylist():
        s0 = starts.get(r["step_id"])
        if s0 is None:
            continue
        d = out[peer_group(x, r["chip_id"], r["chip_type"])][r["chip_id"]]
        d["busy per step"].append(r["op_ns"] - (r.get("comm_ns") or 0))
        d["start offset"].append(r["first_ns"] - s0)
        d["finish offset"].append(r["last_ns"] - s0)
    return out


def _stand_out(x: RuleInput, chips: Samples, stat: str, shared: bool) -> list[tuple]:
    """(excess, chip, value, peer value, z) of chips whose `stat` stands out. Steps that
    use every chip (training): the chip's median against the other chips' medians. Steps
    served by one chip each (requests): its values against all the others' (a rank test:
    a chip's median over a few requests is noisy, a shift of all of them is not)."""
    out = []
    meds = {c: statistics.median(v[stat]) for c, v in chips.items()}
    for chip, v in chips.items():
        if shared:
            peer = statistics.median(meds.values())
            z = robust_z(meds[chip], meds.values(), Z_FLOOR * x.step_ns)
        else:
            rest = [y for c, w in chips.items() if c != chip for y in w[stat]]
            if len(v[stat]) < 5 or len(rest) < 5:
                continue
            peer, z = statistics.median(rest), rank_z(v[stat], rest) - (RANK_Z - ROBUST_Z)
        excess = meds[chip] - peer
        if z >= ROBUST_Z and excess >= MIN_EXCESS * x.step_ns:
            out.append((excess, chip, meds[chip], peer, z))
    return out


def straggler(x: RuleInput) -> list[Finding]:
    """A chip whose per-step busy time, start or finish stands out among its peers."""
    if not x.training:
        return []  # tasks that are not steps: no step to be late in
    rows = x.tables.step_chips.to_pylist()
    # Steps served by one chip each (requests): their busy time follows the batch each
    # happened to land in, not the chip; only when they start tells chips apart.
    shared = len(rows) >= 2 * len({r["step_id"] for r in rows})
    stats = ("busy per step", "start offset", "finish offset") if shared else ("start offset",)
    out = []
    for (ctype, _model), chips in _samples(x).items():
        if len(chips) < 3:
            continue
        found = [(*c, stat) for stat in stats for c in _stand_out(x, chips, stat, shared)]
        if not found:
            continue
        excess, chip, val, peer, z, stat = max(found, key=lambda f: (f[0], f[1]))
        used = len(chips[chip][stat])
        # the share of the steps that wait for it (a step: every rank's copy of it)
        served = used / max(len({_global_step(x, r["step_id"]) for r in rows}), 1)
        out.append(
            x.finding(
                "straggler",
                chip,
                {
                    "statistic": stat,
                    "chip_ms": ms(val),
                    "peer_median_ms": ms(peer),
                    "excess_ms": ms(excess),
                    "robust_z": round(z, 2),
                    "chip_type": ctype,
                    "chips_compared": len(chips),
                    "steps_compared": used,
                },
                f"{chip} {'works longer' if stat == 'busy per step' else 'runs late'} than the other "
                f"{ctype}s every step: check its clocks/thermals, its data feed, or rebalance its share",
                excess * min(served, 1.0),
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


def _comm_ns(x: RuleInput) -> dict[str, tuple[int, int]]:
    """Per chip with comm ops on it (collective kernels, SendRecv): (comm op ns, other op
    ns), summed. A collective's kernel runs while its rank waits for the others: time
    that moves with the others' lateness, not with this chip's share of the work."""
    comm: dict[str, int] = defaultdict(int)
    other: dict[str, int] = defaultdict(int)
    for r in x.chip_op_rows():
        if r["op_kind"] == "comm":
            comm[r["chip_id"]] += r["op_ns"] or 0
        else:
            other[r["chip_id"]] += r["op_ns"] or 0
    return {c: (v, other[c]) for c, v in comm.items() if v}


def _work_ns(row: dict, waiting: tuple[int, int] | None) -> int:
    """A chip's busy time that is work: without its comm ops, at most the summed time of
    its other ops (which may overlap each other: at most its busy time)."""
    if waiting is None:
        return int(row["busy_ns"])
    return int(min(row["busy_ns"], waiting[1]))


def _step_consistency(x: RuleInput, top: str, peers: list[str]) -> tuple[int, int]:
    """Steps where `top` did more / less work (op time without comm) than its peers' mean."""
    per: dict[int, dict[str, int]] = defaultdict(dict)
    group = {top, *peers}
    for r in x.tables.step_chips.to_pylist():
        if r["chip_id"] in group:
            per[_global_step(x, r["step_id"])][r["chip_id"]] = r["op_ns"] - (r["comm_ns"] or 0)
    wins = losses = 0
    for b in per.values():
        if top not in b or not any(p in b for p in peers):
            continue
        others = statistics.fmean(b[p] for p in peers if p in b)
        if abs(b[top] - others) <= 0.01 * x.step_ns:
            continue
        wins, losses = (wins + 1, losses) if b[top] > others else (wins, losses + 1)
    return wins, losses


def _global_step(x: RuleInput, step_id: str) -> int:
    """The index of the step group (every rank's copy of one step) a step belongs to."""
    if "group_of" not in x.memo:
        ids = x.tables.steps.column("span_id").to_pylist()
        x.memo["group_of"] = {
            ids[i]: k for k, g in enumerate(iv.step_groups(x.tables.steps)) for i in g
        }
    return int(x.memo["group_of"].get(step_id, -1))


def load_imbalance(x: RuleInput, skip: frozenset[str] | set[str] = frozenset()) -> list[Finding]:
    """Busy time spread unevenly over chips of one model doing the same work (not a single
    straggler, which `straggler` names)."""
    t = x.tables
    work = _work(x)
    waiting = _comm_ns(x)
    groups: dict[tuple, dict[str, int]] = defaultdict(dict)
    for r in x.chip_rows():
        key = (*peer_group(x, r["chip_id"], r["chip_type"]), work.get(r["chip_id"]))
        groups[key][r["chip_id"]] = _work_ns(r, waiting.get(r["chip_id"]))
    out = []
    for (ctype, model, kind), chips in groups.items():
        if len(chips) < 2:
            continue
        mean = statistics.fmean(chips.values())
        top = min(chips, key=lambda c: (-chips[c], c))
        low = min(chips, key=lambda c: (chips[c], c))
        if mean <= 0 or top in skip or chips[top] / mean - 1 < IMBALANCE:
            continue
        peers = [c for c in chips if c != top]
        if waiting:  # the windows' busy time counts the waiting too: steps tell instead
            wins, losses = _step_consistency(x, top, peers)
        else:
            wins, losses = _consistency(x, top, peers)
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
        if any('"launch"' in (s["links"] or "") for s in leaves if s["chip_type"] in COMPUTE_TYPES):
            continue  # launched device work (a profiler trace): host-bound judges its waits
        busy = st.busy(s for s in leaves if _fabric(s))
        idle = iv.subtract([(st.start_ns, st.end_ns)], busy)
        idle_total += iv.length(idle)
        step_total += st.duration_ns
        hosts: dict[str, list] = defaultdict(list)
        for s in leaves:
            key = _host_key(s)
            if key:
                hosts[key].append((s["start_ns"], s["end_ns"]))  # idle is inside the step
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
