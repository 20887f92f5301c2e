"""Device time by kind, and the kernels that take most of it: the report's kernel breakdown.

Over every span on a GPU/NPU chip (for an imported PyTorch profiler trace: each kernel,
copy, memset and stream sync) in the analysed range: count and summed time per `op_kind`
(`compute`, `comm` for collectives, `memcpy`, `memset`, `sync`), and the top names by
summed time. Times are sums over spans (two streams busy at once count twice, as
HolisticTraceAnalysis's per-kernel sums do); shares are of the summed time of all kinds.
One aggregate query over the chip spans, per chip and name.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

TOP = 10
KIND_ORDER = ("compute", "comm", "memcpy", "memset", "sync")

_SQL = """
SELECT CAST(chip_id AS VARCHAR) AS chip, coalesce(CAST(op_kind AS VARCHAR), 'compute') AS kind,
       CAST(name AS VARCHAR) AS name, count(*) AS n,
       sum(least(end_ns, {hi}) - greatest(start_ns, {lo})) AS ns,
       max(end_ns - start_ns) AS longest
FROM spans_raw
WHERE chip_type IN ('gpu', 'npu') AND end_ns > start_ns AND end_ns > {lo} AND start_ns < {hi}
  AND (op_kind IS NULL OR op_kind <> 'idle')
GROUP BY ALL
"""


def kernel_breakdown(con: Any, lo: int, hi: int, top: int = TOP) -> dict[str, Any]:
    """{"chips", "kernels", "time_ms", "by_kind": [{kind, kernels, time_ms, share}],
    "top": [{name, kind, kernels, time_ms, share, mean_us, max_us, chips}]}; an empty dict
    when no span sits on a GPU/NPU chip.

    Args:
        con: a `chiptrace.connect()` connection.
        lo, hi: the analysed range (Unix ns); spans are clipped to it.
        top: how many names to list.
    """
    rows = con.sql(_SQL.format(lo=int(lo), hi=int(hi))).fetchall()
    if not rows:
        return {}
    kinds: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    names: dict[tuple[str, str], list[Any]] = {}
    chips = set()
    for chip, kind, name, n, ns, longest in rows:
        chips.add(chip)
        kinds[kind][0] += n
        kinds[kind][1] += float(ns)
        cur = names.setdefault((name, kind), [0, 0.0, 0, set()])
        cur[0] += n
        cur[1] += float(ns)
        cur[2] = max(cur[2], int(longest))
        cur[3].add(chip)
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
    n, ns, longest, chips = v
    return {
        "name": name,
        "kind": kind,
        "kernels": n,
        "time_ms": round(ns / 1e6, 4),
        "share": round(ns / total, 4),
        "mean_us": round(ns / n / 1e3, 3),
        "max_us": round(longest / 1e3, 3),
        "chips": len(chips),
    }
