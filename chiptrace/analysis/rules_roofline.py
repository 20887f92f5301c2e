"""Rules from the roofline: a chip far below its peers' efficiency, what bounds the top op,
and a faster precision the chips have.

Both need peaks from a topology (the emulator records one; `chiptrace.init` users may put
one in the manifest); without it they say nothing.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from typing import Any

from chiptrace.analysis.findings import Finding
from chiptrace.analysis.rule_input import RuleInput, ms
from chiptrace.analysis.rules_chips import peer_group
from chiptrace.analysis.workloads import family
from chiptrace.topology import Topology

SLOW_VS_PEERS = 0.6  # a chip below 60% of its peers' roofline efficiency
FAST_FORMAT_GAIN = 1.5  # a format at least 1.5x the peak of the one in use
FAST_FORMATS = ("fp8", "nvfp4")  # what training and serving move to (int8 is a different job)


def _roofline_rows(x: RuleInput) -> list[dict[str, Any]]:
    topo = x.tables.topology
    rows = []
    for r in x.chip_op_rows():
        if (r["op_kind"] or "compute") != "compute" or not r["flops"] or r["op_ns"] <= 0:
            continue
        peak = topo.peak(r["chip_id"], r["op_precision"])
        if not peak:
            continue
        spec = topo.chips.get(r["chip_id"])
        bw = spec.memory_bandwidth if spec else None
        ideal = r["flops"] / peak
        mem = (r["bytes"] or 0) / bw if bw else 0.0
        rows.append({**r, "ideal_ns": max(ideal, mem) * 1e9, "compute_s": ideal, "mem_s": mem})
    return rows


def roofline(x: RuleInput) -> list[Finding]:
    """Ops far below their roofline on one chip (vs peers of its model), and what bounds
    the top op."""
    rows = _roofline_rows(x)
    if not rows:
        return []
    eff: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    group_of = {}
    for r in rows:
        eff[r["chip_id"]][0] += r["ideal_ns"]
        eff[r["chip_id"]][1] += r["op_ns"]
        group_of[r["chip_id"]] = peer_group(x, r["chip_id"], r["chip_type"])
    groups: dict[tuple, dict[str, tuple[float, float]]] = defaultdict(dict)
    for chip, (ideal, real) in eff.items():
        groups[group_of[chip]][chip] = (ideal / real, real)
    out = []
    for (ctype, _model), chips in groups.items():
        if len(chips) < 2:
            continue
        peer = statistics.median(e for e, _ in chips.values())
        for chip, (e, real) in chips.items():
            if e >= SLOW_VS_PEERS * peer:
                continue
            lost = real * (1 - e / peer)
            out.append(
                x.finding(
                    "compute-bound",
                    chip,
                    {
                        "roofline_efficiency": round(e, 4),
                        "peer_efficiency": round(peer, 4),
                        "compute_ms": ms(real),
                        "lost_ms": ms(lost),
                        "chip_type": ctype,
                    },
                    f"{chip} reaches {e:.0%} of its roofline where its peers reach {peer:.0%}: "
                    f"check for throttling or a degraded part, or move work off it",
                    lost / x.n_steps,
                )
            )
    return out + _dominant_op(x, rows)


def _dominant_op(x: RuleInput, rows: list[dict[str, Any]]) -> list[Finding]:
    per: dict[tuple[str, str], dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for r in rows:
        d = per[(r["chip_type"], family(r["name"] or ""))]  # fwd.3 and fwd.12 are one op
        for k in ("op_ns", "compute_s", "mem_s", "ideal_ns", "flops", "bytes"):
            d[k] += r[k] or 0
    (ctype, name), d = max(per.items(), key=lambda kv: (kv[1]["op_ns"], kv[0]))
    bound = "compute-bound" if d["compute_s"] >= d["mem_s"] else "memory-bound"
    chips = sum(1 for r in x.chip_rows() if r["chip_type"] == ctype) or 1
    hint = (
        "use a faster precision or fewer FLOPs (fusion, sparsity)"
        if bound == "compute-bound"
        else "raise arithmetic intensity: fuse ops, larger tiles or batch"
    )
    f = x.finding(
        bound,
        f"{name} on {ctype}",
        {
            "time_share": round(d["op_ns"] / (x.tables.wall_ns * chips), 4),
            "roofline_efficiency": round(d["ideal_ns"] / d["op_ns"], 4),
            "intensity_flop_per_byte": round(d["flops"] / d["bytes"], 2) if d["bytes"] else None,
        },
        f"{name} dominates {ctype} time and is {bound}: {hint}",
        0.0,  # a description of the work, not a fault: nothing to save by itself
        "info",
    )
    return [f]


def _faster(topo: Topology, chip: str, precision: str) -> tuple[str, float] | None:
    """The fastest format the chip has at >= FAST_FORMAT_GAIN x the peak of `precision`,
    and that ratio (this chip's own pair: bf16 -> nvfp4 is 4x on a B200, fp32 -> nvfp4 8x)."""
    cur = topo.peak(chip, precision)
    spec = topo.chips.get(chip)
    if not cur or spec is None:
        return None
    fast = [
        (p, v / cur) for p, v in spec.peak_flops.items() if p in FAST_FORMATS and p != precision
    ]
    fast = [(p, r) for p, r in fast if r >= FAST_FORMAT_GAIN]
    return max(fast, key=lambda pr: (pr[1], pr[0])) if fast else None


def precision_opportunity(x: RuleInput) -> list[Finding]:
    """Compute-bound ops in a precision whose chip has a much faster format: each op saves
    `time x (1 - 1/ratio)` for its own precision and chip; memory-bound ops are left out (a
    narrower format speeds them by bytes, not by the FLOP ratio)."""
    topo = x.tables.topology
    saved: dict[str, float] = defaultdict(float)
    heavy: dict[str, dict[tuple[str, str], float]] = defaultdict(lambda: defaultdict(float))
    where: dict[str, set[str]] = defaultdict(set)
    for r in _roofline_rows(x):
        if r["op_precision"] in FAST_FORMATS or r["compute_s"] < r["mem_s"]:
            continue
        fast = _faster(topo, r["chip_id"], r["op_precision"] or "fp32")
        if fast is None:
            continue
        saved[r["chip_type"]] += r["op_ns"] * (1 - 1 / fast[1])
        heavy[r["chip_type"]][(r["op_precision"] or "fp32", fast[0])] += r["op_ns"]
        where[r["chip_type"]].add(r["chip_id"])
    out = []
    for ctype, ns in saved.items():
        chips = max(sum(1 for r in x.chip_rows() if r["chip_type"] == ctype), 1)
        per_step = ns / chips / x.n_steps  # every chip of the type runs its share in parallel
        (cur, fmt), _ = max(heavy[ctype].items(), key=lambda kv: (kv[1], kv[0]))
        ratio = max((_faster(topo, c, cur) or ("", 1.0))[1] for c in where[ctype])
        if per_step < 0.01 * x.step_ns:
            continue
        out.append(
            x.finding(
                "precision-opportunity",
                ctype,
                {
                    "precision": cur,
                    "faster_format": fmt,
                    "peak_ratio": round(ratio, 2),
                    "compute_ms_per_step": ms(sum(heavy[ctype].values()) / chips / x.n_steps),
                    "precisions": {
                        f"{a}->{b}": ms(v / chips / x.n_steps)
                        for (a, b), v in sorted(heavy[ctype].items())
                    },
                },
                f"{ctype} compute runs in {cur}; the chips have {fmt} at {ratio:.1f}x the peak: try "
                f"{fmt} where accuracy allows",
                per_step,
                "low",  # an opportunity, not a fault: it ranks after every real bottleneck
            )
        )
    return out
