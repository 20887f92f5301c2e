"""Rules about chips: straggler, load imbalance, roofline, precision, starvation.

Each rule is a pure function `rule(x: RuleInput) -> list[Finding]`. Thresholds are module
constants so a reader sees what "stands out" means; shares are fractions of step time (or
of the analysed wall time where a rule works on totals).
"""

from __future__ import annotations

import functools
import re
import statistics
from collections import defaultdict
from dataclasses import dataclass, field

from chiptrace.analysis import steps as iv
from chiptrace.analysis.model import CriticalPath, Finding, severity_for
from chiptrace.analysis.steps import Step
from chiptrace.analysis.tables import COMPUTE_TYPES, HOST_TYPES, TraceTables

ROBUST_Z = 3.5  # the usual cut for the modified z-score (Iglewicz and Hoaglin)
MIN_EXCESS = 0.02  # a straggler must cost at least 2% of a step
IMBALANCE = 0.20  # busiest chip 20% above its type's mean
SLOW_VS_PEERS = 0.6  # a chip below 60% of its peers' roofline efficiency
FAST_FORMAT_GAIN = 1.5  # a format at least 1.5x the peak of the one in use
STARVED = 0.05  # compute idle while the host works, 5% of a step
_LAYER_SUFFIX = re.compile(r"[._:#-]?\d+$")


@dataclass
class RuleInput:
    """Everything a rule may read: the run's tables and the sampled steps' detail."""

    tables: TraceTables
    steps: list[Step] = field(default_factory=list)
    paths: list[CriticalPath] = field(default_factory=list)
    step_p50_ns: float = 0.0

    @property
    def step_ns(self) -> float:
        """The time unit shares are taken of: the median step, else the wall time."""
        return self.step_p50_ns or float(self.tables.wall_ns)


def robust_z(value: float, values: list[float], floor: float) -> float:
    """Modified z-score of `value` among `values`: (x - median) / (1.4826 * MAD)."""
    med = statistics.median(values)
    mad = statistics.median([abs(v - med) for v in values])
    return (value - med) / max(1.4826 * mad, floor, 1e-9)


def _ms(ns: float) -> float:
    return round(ns / 1e6, 4)


def straggler(x: RuleInput) -> list[Finding]:
    """A chip whose per-step busy time, start or finish stands out among its type."""
    t = x.tables
    starts = dict(
        zip(
            t.steps.column("trace_id").to_pylist(),
            t.steps.column("start_ns").to_pylist(),
            strict=True,
        )
    )
    per: dict[tuple[str, str], dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for r in t.step_chips.to_pylist():
        s0 = starts.get(r["trace_id"])
        if s0 is None:
            continue
        d = per[(r["chip_type"], r["chip_id"])]
        d["busy per step"].append(r["op_ns"])
        d["start offset"].append(r["first_ns"] - s0)
        d["finish offset"].append(r["last_ns"] - s0)
    by_type: dict[str, dict[str, dict[str, float]]] = defaultdict(dict)
    for (ctype, chip), stats in per.items():
        by_type[ctype][chip] = {k: statistics.median(v) for k, v in stats.items()}
    out = []
    for ctype, chips in by_type.items():
        if len(chips) < 3:
            continue
        best: tuple[float, str, str, float, float, float] | None = None
        for stat in ("busy per step", "start offset", "finish offset"):
            vals = [c[stat] for c in chips.values()]
            med = statistics.median(vals)
            for chip, c in chips.items():
                excess = c[stat] - med
                z = robust_z(c[stat], vals, 0.01 * x.step_ns)
                if z >= ROBUST_Z and excess >= MIN_EXCESS * x.step_ns:
                    if best is None or excess > best[0]:
                        best = (excess, chip, stat, c[stat], med, z)
        if best is None:
            continue
        excess, chip, stat, val, med, z = best
        steps_used = len(per[(ctype, chip)]["busy per step"])
        share = min(excess / x.step_ns, 1.0)
        out.append(
            Finding(
                "straggler",
                severity_for(share),
                chip,
                {
                    "statistic": stat,
                    "chip_ms": _ms(val),
                    "peer_median_ms": _ms(med),
                    "excess_ms": _ms(excess),
                    "robust_z": round(z, 2),
                    "chip_type": ctype,
                    "chips_compared": len(chips),
                    "steps_compared": steps_used,
                },
                f"{chip} {'works longer' if stat == 'busy per step' else 'runs late'} than the other "
                f"{ctype}s every step: check its clocks/thermals, its data feed, or rebalance its share",
                share,
            )
        )
    return out


def load_imbalance(x: RuleInput, skip: set[str] = frozenset()) -> list[Finding]:
    """Busy time spread unevenly over the chips of one type (not a single straggler)."""
    t = x.tables
    by_type: dict[str, dict[str, int]] = defaultdict(dict)
    for r in t.chips.to_pylist():
        by_type[r["chip_type"]][r["chip_id"]] = r["busy_ns"]
    out = []
    for ctype, chips in by_type.items():
        if len(chips) < 2:
            continue
        mean = statistics.fmean(chips.values())
        top = max(chips, key=lambda c: chips[c])
        low = min(chips, key=lambda c: chips[c])
        if mean <= 0 or top in skip:
            continue
        imb = chips[top] / mean - 1
        share = (chips[top] - mean) / t.wall_ns
        if imb < IMBALANCE or share < 0.01:
            continue
        out.append(
            Finding(
                "load-imbalance",
                severity_for(share),
                top,
                {
                    "chip_type": ctype,
                    "busiest": top,
                    "busiest_util": round(chips[top] / t.wall_ns, 4),
                    "idlest": low,
                    "idlest_util": round(chips[low] / t.wall_ns, 4),
                    "mean_util": round(mean / t.wall_ns, 4),
                    "imbalance": round(imb, 4),
                    "chips": len(chips),
                },
                f"spread work across the {len(chips)} {ctype}s (dynamic scheduling, or re-shard: "
                f"{top} is {imb:.0%} above the mean)",
                share,
            )
        )
    return out


def _roofline_rows(t: TraceTables) -> list[dict]:
    rows = []
    for r in t.chip_ops.to_pylist():
        if (r["op_kind"] or "compute") != "compute" or not r["flops"] or r["op_ns"] <= 0:
            continue
        peak = t.topology.peak(r["chip_id"], r["op_precision"])
        spec = t.topology.chips.get(r["chip_id"])
        if not peak:
            continue
        bw = spec.memory_bandwidth if spec else None
        ideal = r["flops"] / peak
        mem = (r["bytes"] or 0) / bw if bw else 0.0
        rows.append(
            {
                **r,
                "ideal_ns": max(ideal, mem) * 1e9,
                "compute_s": ideal,
                "mem_s": mem,
                "peak": peak,
                "membw": bw,
            }
        )
    return rows


def roofline(x: RuleInput) -> list[Finding]:
    """Ops far below their roofline on one chip (vs its peers), and what bounds the top op."""
    t = x.tables
    rows = _roofline_rows(t)
    if not rows:
        return []
    eff: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    ctype_of = {}
    for r in rows:
        eff[r["chip_id"]][0] += r["ideal_ns"]
        eff[r["chip_id"]][1] += r["op_ns"]
        ctype_of[r["chip_id"]] = r["chip_type"]
    out = []
    by_type: dict[str, dict[str, tuple[float, float]]] = defaultdict(dict)
    for chip, (ideal, real) in eff.items():
        by_type[ctype_of[chip]][chip] = (ideal / real, real)
    for ctype, chips in by_type.items():
        if len(chips) < 2:
            continue
        peer = statistics.median(e for e, _ in chips.values())
        for chip, (e, real) in chips.items():
            if e >= SLOW_VS_PEERS * peer:
                continue
            lost = real * (1 - e / peer)
            share = min(lost / t.wall_ns, 1.0)
            out.append(
                Finding(
                    "compute-bound",
                    severity_for(share),
                    chip,
                    {
                        "roofline_efficiency": round(e, 4),
                        "peer_efficiency": round(peer, 4),
                        "compute_ms": _ms(real),
                        "lost_ms": _ms(lost),
                        "chip_type": ctype,
                    },
                    f"{chip} reaches {e:.0%} of its roofline where its peers reach {peer:.0%}: "
                    f"check for throttling or a degraded part, or move work off it",
                    share,
                )
            )
    out += _dominant_op(t, rows)
    return out


def _dominant_op(t: TraceTables, rows: list[dict]) -> list[Finding]:
    per: dict[tuple[str, str], dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for r in rows:
        # "fwd.3" and "fwd.12" are one op for this purpose: layers are numbered
        d = per[(r["chip_type"], _LAYER_SUFFIX.sub("", r["name"]) or r["name"])]
        for k in ("op_ns", "compute_s", "mem_s", "ideal_ns", "flops", "bytes"):
            d[k] += r[k] or 0
    (ctype, name), d = max(per.items(), key=lambda kv: kv[1]["op_ns"])
    bound = "compute-bound" if d["compute_s"] >= d["mem_s"] else "memory-bound"
    chips = sum(1 for r in t.chips.to_pylist() if r["chip_type"] == ctype) or 1
    share = d["op_ns"] / (t.wall_ns * chips)
    hint = (
        "use a faster precision or fewer FLOPs (fusion, sparsity)"
        if bound == "compute-bound"
        else "raise arithmetic intensity: fuse ops, larger tiles or batch"
    )
    return [
        Finding(
            bound,
            "info",
            f"{name} on {ctype}",
            {
                "time_share": round(share, 4),
                "roofline_efficiency": round(d["ideal_ns"] / d["op_ns"], 4),
                "intensity_flop_per_byte": round(d["flops"] / d["bytes"], 2)
                if d["bytes"]
                else None,
            },
            f"{name} dominates {ctype} time and is {bound}: {hint}",
            share,
        )
    ]


def precision_opportunity(x: RuleInput) -> list[Finding]:
    """Heavy fp32/fp16/bf16 compute on a chip type whose chips have a faster format."""
    t = x.tables
    per: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    gain: dict[str, tuple[str, float]] = {}
    for r in t.chip_ops.to_pylist():
        if (r["op_kind"] or "compute") != "compute" or r["op_precision"] not in (
            "fp32",
            "fp16",
            "bf16",
        ):
            continue
        spec = t.topology.chips.get(r["chip_id"])
        cur = t.topology.peak(r["chip_id"], r["op_precision"])
        if spec is None or not cur:
            continue
        fast = [
            (p, v)
            for p, v in spec.peak_flops.items()
            if p in ("fp8", "nvfp4") and v >= FAST_FORMAT_GAIN * cur
        ]
        if fast:
            p, v = max(fast, key=lambda pv: pv[1])
            per[r["chip_type"]][r["op_precision"]] += r["op_ns"]
            gain[r["chip_type"]] = (p, v / cur)
    out = []
    for ctype, by_prec in per.items():
        chips = sum(1 for r in t.chips.to_pylist() if r["chip_type"] == ctype) or 1
        heavy = sum(by_prec.values())
        fmt, ratio = gain[ctype]
        saving = heavy * (1 - 1 / ratio) / chips
        share = min(saving / t.wall_ns, 1.0)
        if share < 0.01:
            continue
        cur = max(by_prec, key=lambda p: by_prec[p])
        sev = "low"  # an opportunity, not a fault: it ranks after every real bottleneck
        out.append(
            Finding(
                "precision-opportunity",
                sev,
                ctype,
                {
                    "precision": cur,
                    "faster_format": fmt,
                    "peak_ratio": round(ratio, 2),
                    "compute_share": round(heavy / chips / t.wall_ns, 4),
                    "saving_share": round(share, 4),
                },
                f"{ctype} compute runs in {cur}; the chips have {fmt} at {ratio:.1f}x the peak: try "
                f"{fmt} where accuracy allows",
                share,
            )
        )
    return out


def _fabric(s: dict) -> bool:
    """A span keeping a GPU/NPU side busy: work on one, or a transfer between two."""
    return _fabric_key(s["chip_type"], s["link_id"], s["link_src"], s["link_dst"])


@functools.lru_cache(maxsize=65536)
def _fabric_key(chip_type: str | None, link: str | None, src: str | None, dst: str | None) -> bool:
    # Cached: a step has 100,000s of spans but only a few hundred distinct chips and links.
    if chip_type in COMPUTE_TYPES:
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
        busy = iv.union((s["start_ns"], s["end_ns"]) for s in leaves if _fabric(s))
        idle = iv.subtract([(st.start_ns, st.end_ns)], busy)
        idle_total += iv.length(idle)
        step_total += st.duration_ns
        hosts: dict[str, list] = defaultdict(list)
        for s in leaves:
            key = _host_key(s)
            if key:
                hosts[key].append((s["start_ns"], s["end_ns"]))
        for key, ivs in hosts.items():
            totals[key] += iv.length(iv.intersect(iv.union(ivs), idle))
    if not totals or step_total <= 0:
        return []
    culprit = max(totals, key=lambda k: totals[k])
    share = totals[culprit] / step_total
    if share < STARVED:
        return []
    return [
        Finding(
            # Some serial input work is normal; a quarter of every step is not.
            "starvation",
            severity_for(share, high=0.25, medium=0.08),
            culprit,
            {
                "compute_idle_share": round(idle_total / step_total, 4),
                "culprit_busy_while_idle_share": round(share, 4),
                "steps_sampled": len(x.steps),
            },
            f"GPUs/NPUs wait {share:.0%} of a step while {culprit} works: overlap it with compute "
            f"(prefetch, more workers, offload) or give it more capacity",
            share,
        )
    ]
