"""`Report`: everything `chiptrace report` shows, and its documented JSON (docs/sql.md)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from chiptrace.analysis.findings import CriticalPath, Finding
from chiptrace.analysis.tables import TraceTables

REPORT_VERSION = 2  # 2: findings carry step, saving_ms, saving_pct; workloads, endpoints


@dataclass(frozen=True)
class Report:
    """Everything `chiptrace report` shows; `to_dict()` is the documented JSON."""

    metrics: dict[str, Any]
    findings: list[Finding]
    critical_path: CriticalPath | None
    utilization: dict[str, Any]
    chips: list[dict[str, Any]] = field(default_factory=list)
    links: list[dict[str, Any]] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)
    median_path: CriticalPath | None = None
    workloads: list[dict[str, Any]] = field(default_factory=list)
    endpoints: list[dict[str, Any]] = field(default_factory=list)
    kernels: dict[str, Any] = field(default_factory=dict)
    launch: list[dict[str, Any]] = field(default_factory=list)
    breakdown: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """Stable keys: version, sources, metrics, findings (one ranked list over every
        workload), critical_path (slowest step of the first workload), critical_path_median,
        workloads, endpoints, kernels, launch, utilization, chips, links, time_breakdown
        (docs/sql.md)."""
        return {
            "version": REPORT_VERSION,
            "sources": self.sources,
            "metrics": self.metrics,
            "findings": [f.to_dict() for f in self.findings],
            "critical_path": path_dict(self.critical_path),
            "critical_path_median": path_dict(self.median_path, max_segments=0),
            "workloads": self.workloads,
            "endpoints": self.endpoints,
            "kernels": self.kernels,
            "launch": self.launch,
            "utilization": self.utilization,
            "chips": self.chips,
            "links": self.links,
            "time_breakdown": self.breakdown,
        }


def path_dict(p: CriticalPath | None, max_segments: int = 200) -> dict[str, Any] | None:
    """A critical path as plain JSON: shares by chip type, link type, op kind, and segments."""
    if p is None or not p.segments:
        return None
    segs = [
        {
            "name": s.name,
            "via": s.via,
            "chip_id": s.chip_id,
            "link_id": s.link_id,
            "op_kind": s.op_kind,
            "start_ms": round((s.start_ns - p.start_ns) / 1e6, 6),
            "on_path_ms": round(s.on_path_ns / 1e6, 6),
        }
        for s in p.segments[:max_segments]
    ]
    root_end = p.end_ns if p.root_end_ns is None else min(p.root_end_ns, p.end_ns)
    return {
        "trace_id": p.trace_id,
        "root": p.root,
        "duration_ms": round(p.duration_ns / 1e6, 6),
        "root_ms": round((root_end - p.start_ns) / 1e6, 6),
        "by_chip_type": _r(p.share("chip_type")),
        "by_link_type": _r(p.share("link_type")),
        "by_op_kind": _r(p.share("op_kind")),
        "by_name": _r(dict(list(p.share("name").items())[:10])),
        "segments": segs,
        "segments_total": len(p.segments),
    }


def _r(d: dict[str, float]) -> dict[str, float]:
    return {k: round(v, 4) for k, v in d.items()}


def chip_rows(t: TraceTables) -> list[dict[str, Any]]:
    """Per chip: id, type, ops, utilization (busy over the analysed wall time)."""
    return [
        {
            "chip_id": r["chip_id"],
            "chip_type": r["chip_type"],
            "ops": r["ops"],
            "utilization": round(r["busy_ns"] / t.wall_ns, 4),
        }
        for r in t.chips.to_pylist()
    ]


def link_rows(t: TraceTables) -> list[dict[str, Any]]:
    """Per link direction: transfers, bytes, busy share, GB/s while busy, bandwidth."""
    out = []
    for r in t.links.to_pylist():
        bw = t.topology.bandwidth(r["link_id"])
        busy, nbytes = r["busy_ns"] or 0, r["bytes"] or 0.0
        out.append(
            {
                "link_id": r["link_id"],
                "link_type": r["link_type"],
                "src": r["link_src"],
                "dst": r["link_dst"],
                "transfers": r["transfers"],
                "bytes": nbytes,
                "busy_share": round(busy / t.wall_ns, 4),
                "GBps_while_busy": round(nbytes / busy, 3) if busy and nbytes else None,
                "bandwidth_GBps": None if bw is None else round(bw / 1e9, 3),
                "bandwidth_fraction_while_busy": round(nbytes / busy * 1e9 / bw, 4)
                if bw and busy and nbytes
                else None,
            }
        )
    return out


def utilization_series(t: TraceTables) -> dict[str, Any]:
    """Mean utilization per chip type per window: {window_ms, t0_ns, series: {type: [..]}}."""
    n_win = max((t.wall_ns + t.window_ns - 1) // t.window_ns, 1)
    count: dict[str, int] = {}
    type_of: dict[str, str] = {}
    for r in t.chips.to_pylist():
        count[r["chip_type"]] = count.get(r["chip_type"], 0) + 1
        type_of[r["chip_id"]] = r["chip_type"]
    series = {ct: [0.0] * n_win for ct in sorted(count)}
    for r in t.util.to_pylist():
        k = int(r["window_index"])
        ctype = type_of.get(r["chip_id"])
        if 0 <= k < n_win and ctype in series:
            width = min(t.window_ns, t.t1 - (t.t0 + k * t.window_ns)) or 1
            series[ctype][k] += r["busy_ns"] / width / count[ctype]
    return {
        "window_ms": round(t.window_ns / 1e6, 6),
        "t0_ns": t.t0,
        "series": {k: [round(min(v, 1.0), 4) for v in vs] for k, vs in series.items()},
    }
