"""Rules about links and communication: link-bound, latency-bound, poor overlap, drops."""

from __future__ import annotations

import functools
import statistics
from collections import defaultdict

from chiptrace.analysis import steps as iv
from chiptrace.analysis.model import Finding, severity_for
from chiptrace.analysis.rules_chips import RuleInput, _ms
from chiptrace.analysis.tables import COMPUTE_TYPES

SATURATED = 0.70  # busy and moving data at >= 70% of the link's bandwidth
BUSY = 0.30  # ... for at least 30% of the time
SLOW_LINK = 0.5  # achieved bandwidth under half that of links of the same type
LATENCY_DOMINATES = 0.5  # latency at least half of a typical transfer's time
SMALL_MESSAGE = 64 * 1024  # without a topology: "small" means under 64 KiB
MANY = 50
POOR_OVERLAP = 0.30  # under 30% of communication hidden behind compute


@functools.lru_cache(maxsize=65536)
def _chip_type(chip: str | None) -> str:
    return (chip or "").rsplit("/", 1)[-1].split(":")[0]


def _physical(links: list[dict]) -> dict[str, dict]:
    """Both directions of each link together. A transfer routed over several hops is one
    span per hop with the route's time, so a slow hop makes every hop of its routes look
    slow in one direction; only the slow link itself looks slow in both."""
    out: dict[str, dict] = {}
    for r in links:
        p = out.setdefault(
            r["link_id"],
            {"type": r["link_type"], "bytes": 0.0, "busy": 0, "transfers": 0, "sizes": []},
        )
        p["bytes"] += r["bytes"]
        p["busy"] += r["busy_ns"]
        p["transfers"] += r["transfers"]
        p["sizes"].append(r["median_bytes"] or 0)
    return out


def _slow_links(x: RuleInput, links: list[dict]) -> list[Finding]:
    t = x.tables
    phys = _physical(links)
    peers: dict[str, list[float]] = defaultdict(list)
    for p in phys.values():
        peers[p["type"]].append(p["bytes"] / p["busy"])
    out = []
    for link_id, p in phys.items():
        if len(peers[p["type"]]) < 3 or statistics.median(p["sizes"]) < SMALL_MESSAGE:
            continue
        peer = statistics.median(peers[p["type"]]) * 1e9
        achieved = p["bytes"] / p["busy"] * 1e9
        if achieved >= SLOW_LINK * peer:
            continue
        lost = p["busy"] * (1 - achieved / peer)
        share = min(lost / (x.step_ns * max(t.steps.num_rows, 1)), 1.0)
        nominal = t.topology.bandwidth(link_id)
        out.append(
            Finding(
                "link-bound",
                severity_for(share),
                link_id,
                {
                    "cause": "slow link",
                    "link_type": p["type"],
                    "achieved_GBps": round(achieved / 1e9, 3),
                    "peer_median_GBps": round(peer / 1e9, 3),
                    "bandwidth_GBps": round(nominal / 1e9, 3) if nominal else None,
                    "busy_share_both_directions": round(p["busy"] / t.wall_ns, 4),
                    "transfers": p["transfers"],
                    "lost_ms": _ms(lost),
                },
                f"{link_id} moves {achieved / peer:.0%} of what other {p['type']} links do: check "
                f"the link (degraded lanes, errors) or route around it",
                share,
            )
        )
    return out


def link_bound(x: RuleInput) -> list[Finding]:
    """A link far slower than its peers, or a link direction near saturation while the
    chip it feeds waits."""
    t = x.tables
    links = [r for r in t.links.to_pylist() if r["busy_ns"] > 0 and r["bytes"]]
    out = _slow_links(x, links)
    slow = {f.culprit for f in out}
    util = {r["chip_id"]: r["busy_ns"] / t.wall_ns for r in t.chips.to_pylist()}
    for r in links:
        achieved = r["bytes"] / r["busy_ns"] * 1e9  # bytes/s while busy
        nominal = t.topology.bandwidth(r["link_id"])
        busy = r["busy_ns"] / t.wall_ns
        if r["link_id"] in slow or busy < BUSY or (nominal and achieved < SATURATED * nominal):
            continue
        waiting = 1 - util.get(r["link_dst"] or "", 0.0)
        share = min(busy * waiting, 1.0)
        out.append(
            Finding(
                "link-bound",
                severity_for(share),
                r["link_id"],
                {
                    "cause": "saturated",
                    "link_type": r["link_type"],
                    "src": r["link_src"],
                    "dst": r["link_dst"],
                    "busy_share": round(busy, 4),
                    "achieved_GBps": round(achieved / 1e9, 3),
                    "bandwidth_GBps": round(nominal / 1e9, 3) if nominal else None,
                    "dst_idle_share": round(waiting, 4),
                    "transfers": r["transfers"],
                },
                f"{r['link_id']} is busy {busy:.0%} of the time at {achieved / 1e9:.0f} GB/s: "
                f"compress or shard the traffic, or use a faster link",
                share,
            )
        )
    return out


def latency_bound(x: RuleInput) -> list[Finding]:
    """Many small transfers whose time is mostly link latency, not bytes."""
    t = x.tables
    groups: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for r in t.links.to_pylist():
        groups[(r["link_type"], r["name"])].append(r)
    out = []
    for (ltype, name), rows in groups.items():
        n = sum(r["transfers"] for r in rows)
        med_bytes = statistics.median(r["median_bytes"] or 0 for r in rows)
        med_ns = statistics.median(r["median_ns"] or 0 for r in rows)
        lat = [
            t.topology.links[r["link_id"]].latency_ns
            for r in rows
            if r["link_id"] in t.topology.links and t.topology.links[r["link_id"]].latency_ns
        ]
        bws = [
            t.topology.bandwidth(r["link_id"]) for r in rows if t.topology.bandwidth(r["link_id"])
        ]
        if lat and bws:
            wire = statistics.median(lat) + med_bytes / statistics.median(bws) * 1e9
            frac = statistics.median(lat) / wire if wire else 0.0
        else:
            frac = 1.0 if med_bytes and med_bytes < SMALL_MESSAGE else 0.0
        if n < MANY or frac < LATENCY_DOMINATES:
            continue
        xfer = sum(r["xfer_ns"] for r in rows) / max(len(rows), 1)
        share = min(xfer * frac / t.wall_ns, 1.0)
        out.append(
            Finding(
                "latency-bound",
                severity_for(share),
                f"{name} on {ltype}",
                {
                    "transfers": n,
                    "median_bytes": med_bytes,
                    "median_us": round(med_ns / 1e3, 3),
                    "latency_share": round(frac, 4),
                    "links": len(rows),
                },
                f"{n} transfers of ~{med_bytes / 1024:.0f} KiB spend {frac:.0%} of their time in "
                f"latency: batch them into larger messages (bigger buckets, fused all-reduce)",
                share,
            )
        )
    return out


def _is_comm(s: dict) -> bool:
    """Collective traffic: transfers on the GPU/NPU fabric (both ends compute chips or
    switches; unknown ends count too), or comm ops on a compute chip. Host copies (PCIe,
    C2C to a CPU) are the data path, judged by the starvation rule instead."""
    return _comm_key(s["link_id"], s["link_src"], s["link_dst"], s["chip_type"], s["op_kind"])


@functools.lru_cache(maxsize=65536)
def _comm_key(
    link: str | None, src: str | None, dst: str | None, chip_type: str | None, op_kind: str | None
) -> bool:
    if link:
        ends = [_chip_type(src), _chip_type(dst)]
        return all(e in (*COMPUTE_TYPES, "switch", "") for e in ends)
    return chip_type in COMPUTE_TYPES and op_kind == "comm"


def _is_compute(s: dict) -> bool:
    return s["chip_type"] in COMPUTE_TYPES and s["op_kind"] in (None, "compute", "memcpy")


def overlap_figures(x: RuleInput) -> dict[str, float]:
    """Communication vs compute on the compute chips over the sampled steps, in ns:
    comm, hidden (overlapped), exposed, compute, step; plus exposed ns per comm span name
    under keys ``name:<span name>``."""
    out: dict[str, float] = defaultdict(float)
    for st in x.steps:
        leaves = [s for s in st.leaves() if s["end_ns"] > s["start_ns"]]
        comm = iv.union((s["start_ns"], s["end_ns"]) for s in leaves if _is_comm(s))
        compute = iv.union((s["start_ns"], s["end_ns"]) for s in leaves if _is_compute(s))
        if not compute:
            continue
        exposed = iv.subtract(comm, compute)
        out["comm"] += iv.length(comm)
        out["hidden"] += iv.length(iv.intersect(comm, compute))
        out["exposed"] += iv.length(exposed)
        out["compute"] += iv.length(compute)
        out["step"] += st.duration_ns
        for s in leaves:
            if _is_comm(s):
                span = [(s["start_ns"], s["end_ns"])]
                out["name:" + s["name"]] += iv.length(iv.intersect(span, exposed))
    return out


def poor_overlap(x: RuleInput) -> list[Finding]:
    """Communication that runs while compute chips do nothing else (not overlapped)."""
    f = overlap_figures(x)
    if not f["step"] or not f["comm"]:
        return []
    overlap = f["hidden"] / f["comm"]
    share = min(f["exposed"], f["compute"]) / f["step"]  # the most overlap could hide
    if overlap >= POOR_OVERLAP or f["exposed"] / f["step"] < 0.05:
        return []
    names = {k[5:]: v for k, v in f.items() if k.startswith("name:")}
    culprit = max(names, key=lambda k: names[k])
    return [
        Finding(
            "poor-overlap",
            severity_for(share),
            culprit,
            {
                "overlap_fraction": round(overlap, 4),
                "comm_share": round(f["comm"] / f["step"], 4),
                "exposed_comm_share": round(f["exposed"] / f["step"], 4),
                "exposed_ms_per_step": _ms(f["exposed"] / max(len(x.steps), 1)),
                "steps_sampled": len(x.steps),
            },
            f"only {overlap:.0%} of communication overlaps compute: start {culprit} per bucket during "
            f"backward instead of after it",
            share,
        )
    ]


def dropped_spans(x: RuleInput) -> list[Finding]:
    """Spans the recorder dropped: the analysis saw less than ran."""
    t = x.tables
    if not t.spans_dropped:
        return []
    frac = t.spans_dropped / max(t.spans + t.spans_dropped, 1)
    return [
        Finding(
            "dropped-spans",
            "medium" if frac >= 0.01 else "low",
            "recorder",
            {"spans_dropped": t.spans_dropped, "dropped_fraction": round(frac, 6)},
            "raise CHIPTRACE_MAX_BUFFERED or flush more often; figures undercount",
            frac,
        )
    ]
