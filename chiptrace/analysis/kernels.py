"""Device time by kind, and the kernels that take most of it: the report's kernel breakdown.

Over every op span on a GPU/NPU chip (for an imported PyTorch profiler trace: each kernel,
copy, memset and stream sync) in the analysed range: count and summed time per `op_kind`
(`compute`, `comm` for collectives, `memcpy`, `memset`, `sync`), and the top names by
summed time. Times are sums over spans (two streams busy at once count twice, as
HolisticTraceAnalysis's per-kernel sums do); shares are of the summed time of all kinds.
Read off `TraceTables.chip_ops` (per chip, kind and name), so it costs no extra scan.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from chiptrace.analysis.tables import COMPUTE_TYPES, TraceTables

TOP = 10
KIND_ORDER = ("compute", "comm", "memcpy", "memset", "sync")


def kernel_breakdown(t: TraceTables, top: int = TOP) -> dict[str, Any]:
    """{"chips", "kernels", "time_ms", "by_kind": [{kind, kernels, time_ms, share}],
    "top": [{name, kind, kernels, time_ms, share, mean_us, chips}]}; an empty dict when no
    span sits on a GPU/NPU chip.

    Args:
        t: the run's tables (`chip_ops` holds the per chip, kind and name sums already).
        top: how many names to list.
    """
    kinds: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    names: dict[tuple[str, str], list[Any]] = {}
    chips = set()
    for r in t.chip_ops.to_pylist():
        if r["chip_type"] not in COMPUTE_TYPES or not r["ops"]:
            continue
        kind, n, ns = r["op_kind"] or "compute", int(r["ops"]), float(r["op_ns"] or 0)
        chips.add(r["chip_id"])
        kinds[kind][0] += n
        kinds[kind][1] += ns
        cur = names.setdefault((r["name"] or "", kind), [0, 0.0, set()])
        cur[0] += n
        cur[1] += ns
        cur[2].add(r["chip_id"])
    if not chips:
        return {}
    total = sum(v[1] for v in kinds.values()) or 1.0
    order = {k: i for i, k in enumerate(KIND_ORDER)}
    by_kind = [
        {
            "kind": k,
            "kernels": int(v[0]),
            "time_ms": round(v[1] / 1e6, 4),
            "share": round(v[1] / total, 4),
        }
        for k, v in sorted(kinds.items(), key=lambda kv: (-kv[1][1], order.get(kv[0], 9)))
    ]
    ranked = sorted(names.items(), key=lambda kv: (-kv[1][1], kv[0]))[:top]
    return {
        "chips": len(chips),
        "kernels": sum(int(v[0]) for v in kinds.values()),
        "time_ms": round(total / 1e6, 4),
        "by_kind": by_kind,
        "top": [_top_row(name, kind, v, total) for (name, kind), v in ranked],
    }


def _top_row(name: str, kind: str, v: list[Any], total: float) -> dict[str, Any]:
    n, ns, chips = v
    return {
        "name": name,
        "kind": kind,
        "kernels": n,
        "time_ms": round(ns / 1e6, 4),
        "share": round(ns / total, 4),
        "mean_us": round(ns / n / 1e3, 3),
        "chips": len(chips),
    }
