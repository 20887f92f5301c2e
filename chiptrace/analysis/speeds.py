"""How fast each chip did its work: against its peers, and against its own model.

`peer_speeds`: per chip, how many times slower than the median chip of its type it does the
same work (ranking.py's "like its peers" fix). `spec_speeds`: for a chip with no peers (the
only DPU), how many times slower than its model it ran, where the run records what its
model reaches (the emulator's `efficiency` knob with the topology's efficiency tables): a
lone chip slower than its model is a fault, not the design's limit.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from typing import Any

from chiptrace.analysis.rule_input import RuleInput

SLOWER = 1.05  # a chip this much slower than its model is slow (its own noise is below)


def _op_rows(x: RuleInput) -> list[tuple[Any, ...]]:
    """Per chip, type, op name and precision: time, flops, bytes, count in the window."""
    t = x.tables
    return x.con.sql(
        "SELECT CAST(chip_id AS VARCHAR) c, CAST(chip_type AS VARCHAR) ty, "
        "CAST(name AS VARCHAR) n, CAST(op_precision AS VARCHAR) p, "
        "sum(end_ns - start_ns)::DOUBLE d, sum(coalesce(op_flops, 0))::DOUBLE f, "
        "sum(coalesce(op_bytes, 0))::DOUBLE b, count(*)::DOUBLE k "
        # a collective's kernel runs until the last rank arrives: waiting, not work
        f"FROM spans_raw WHERE chip_id IS NOT NULL AND link_id IS NULL "
        "AND op_kind IS DISTINCT FROM 'comm' "
        f"AND start_ns >= {int(t.lo)} AND start_ns < {int(t.hi)} GROUP BY ALL"
    ).fetchall()


def peer_speeds(x: RuleInput) -> dict[str, float]:
    """Per chip: how many times slower than the median chip of its type it does the same
    work, weighted by its time in each op. Work is the op's roofline time on that chip
    (flops over its peak at the op's precision, or bytes over its memory bandwidth,
    whichever is longer): decode is memory-bound, prefill compute-bound, and a chip
    dealt bigger batches is not slower for it."""
    t = x.tables
    rows = _op_rows(x)
    per: dict[tuple[str, str], dict[str, tuple[float, float]]] = defaultdict(dict)
    for chip, ctype, name, prec, d, flops, nbytes, count in rows:
        w = roofline_s(t.topology, chip, prec, flops, nbytes) or flops or nbytes or count
        if d > 0 and w > 0:
            per[(ctype, name)][chip] = (d / w, d)
    ratios: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for (_, _), by_chip in per.items():
        if len(by_chip) < 2:
            continue
        for chip, (v, d) in by_chip.items():  # against the others: two DPUs have one peer
            med = statistics.median(o for c, (o, _) in by_chip.items() if c != chip)
            ratios[chip].append((v / med, d))
    return {chip: _weighted_median(rs) for chip, rs in ratios.items()}


def roofline_s(topo: Any, chip: str, prec: str | None, flops: float, nbytes: float) -> float:
    """Roofline seconds of `flops` and `nbytes` on `chip`; 0 where the topology lacks it."""
    peak = topo.peak(chip, prec) if flops else None
    spec = topo.chips.get(chip)
    bw = spec.memory_bandwidth if spec else 0.0
    return max(flops / peak if peak else 0.0, nbytes / bw if bw else 0.0)


def spec_speeds(x: RuleInput, peers: dict[str, float]) -> dict[str, float]:
    """Per chip without peers (not in `peers`) that ran at least SLOWER times slower than
    its model: that factor. Its model is its roofline at the efficiency the run records
    (a workload's `efficiency` knob: `preset`, the topology's tables, of which the least
    any class reaches bounds what this chip should take; `ideal`, the roofline; or one
    fraction); a run that records none (an imported trace) gives nothing."""
    modes = {str((m.get("workload") or {}).get("efficiency")) for m in x.tables.manifests}
    if len(modes) != 1 or "None" in modes or x.con is None:
        return {}
    mode = modes.pop()
    topo = x.tables.topology
    ratios: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for chip, _, _, prec, d, flops, nbytes, _ in _op_rows(x):
        w = roofline_s(topo, chip, prec, flops, nbytes)
        if chip not in peers and chip in topo.chips and d > 0 and w > 0:
            ratios[chip].append((d / 1e9 / w, d))
    out = {}
    for chip, rs in ratios.items():
        k = _weighted_median(rs) / _expected(topo.chips[chip], mode)
        if k >= SLOWER:
            out[chip] = k
    return out


def _expected(spec: Any, mode: str) -> float:
    """Time over roofline time the chip's model takes at most under the run's knob."""
    if mode == "ideal":
        return 1.0
    if mode == "preset":
        fracs = [f for cls, v in spec.efficiency.items() if cls != "comm" for f in v.values()]
        return 1.0 / min(fracs) if fracs else 1.0
    try:
        return 1.0 / float(mode)
    except ValueError:
        return float("inf")  # a knob this code does not know: never slower than it


def _weighted_median(rs: list[tuple[float, float]]) -> float:
    """The median of (value, weight) pairs by weight (time: a chip's busiest ops count)."""
    rs = sorted(rs)
    total = sum(w for _, w in rs)
    acc = 0.0
    for r, w in rs:
        acc += w
        if acc >= total / 2:
            return r
    return rs[-1][0]
