"""Rules about communication: latency-bound transfers, poor overlap, dropped spans."""

from __future__ import annotations

import functools
import statistics
from collections import defaultdict

from chiptrace.analysis import steps as iv
from chiptrace.analysis.model import Finding
from chiptrace.analysis.rule_input import RuleInput, ms
from chiptrace.analysis.tables import COMPUTE_TYPES

LATENCY_DOMINATES = 0.5  # latency at least half of a typical transfer's time
SMALL_MESSAGE = 64 * 1024  # without a topology: "small" means under 64 KiB
MANY = 50
POOR_OVERLAP = 0.30  # under 30% of communication hidden behind compute


@functools.lru_cache(maxsize=65536)
def _chip_type(chip: str | None) -> str:
    return (chip or "").rsplit("/", 1)[-1].split(":")[0]


def latency_bound(x: RuleInput) -> list[Finding]:
    """Many small transfers whose time is mostly link latency, not bytes."""
    t = x.tables
    groups: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for r in x.link_rows():
        groups[(r["link_type"], r["name"])].append(r)
    out = []
    for (ltype, name), rows in groups.items():
        n = sum(r["transfers"] for r in rows)
        med_bytes = statistics.median(r["median_bytes"] or 0 for r in rows)
        med_ns = statistics.median(r["median_ns"] or 0 for r in rows)
        specs = [t.topology.link(r["link_id"]) for r in rows]
        lat = [lk.latency_ns for lk in specs if lk and lk.latency_ns]
        bws = [bw for r in rows if (bw := t.topology.bandwidth(r["link_id"]))]
        if lat and bws:
            wire = statistics.median(lat) + med_bytes / statistics.median(bws) * 1e9
            frac = statistics.median(lat) / wire if wire else 0.0
        else:
            frac = 1.0 if med_bytes and med_bytes < SMALL_MESSAGE else 0.0
        if n < MANY or frac < LATENCY_DOMINATES:
            continue
        xfer = sum(r["xfer_ns"] for r in rows) / max(len(rows), 1)
        out.append(
            x.finding(
                "latency-bound",
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
                # the links work in parallel: one link's latency time, per step
                xfer * frac / x.n_steps,
            )
        )
    return out


def _is_comm(s: dict) -> bool:
    """Collective traffic: transfers tagged `op.kind` comm (whatever route they took: a
    collective rerouted over C2C around a downed NVLink is still the collective), untagged
    transfers on the GPU/NPU fabric (both ends compute chips or switches; unknown ends
    count too), or comm ops on a compute chip. Host copies (PCIe, C2C to a CPU) are the
    data path, judged by the starvation rule instead."""
    return _comm_key(s["link_id"], s["link_src"], s["link_dst"], s["chip_type"], s["op_kind"])


@functools.lru_cache(maxsize=65536)
def _comm_key(
    link: str | None, src: str | None, dst: str | None, chip_type: str | None, op_kind: str | None
) -> bool:
    if link:
        if op_kind is not None:
            return op_kind == "comm"
        ends = [_chip_type(src), _chip_type(dst)]
        return all(e in (*COMPUTE_TYPES, "switch", "") for e in ends)
    return chip_type in COMPUTE_TYPES and op_kind == "comm"


def _is_compute(s: dict) -> bool:
    return s["chip_type"] in COMPUTE_TYPES and s["op_kind"] in (None, "compute", "memcpy")


def overlap_figures(x: RuleInput) -> dict[str, float]:
    """Communication vs compute on the compute chips over the sampled steps, in ns:
    comm, hidden (overlapped), exposed, compute, step; plus exposed ns per comm span name
    under keys ``name:<span name>``; chip_comm: time in comm ops on a chip (summed). Computed once per input (metrics and a rule read it)."""
    if "overlap" in x.memo:
        return x.memo["overlap"]
    out: dict[str, float] = defaultdict(float)
    for st in x.steps:
        leaves = [s for s in st.leaves() if s["end_ns"] > s["start_ns"]]
        out["chip_comm"] += sum(
            s["end_ns"] - s["start_ns"] for s in leaves if not s["link_id"] and _is_comm(s)
        )
        comm = st.busy(s for s in leaves if _is_comm(s))
        compute = st.busy(s for s in leaves if _is_compute(s))
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
                span = [(s["start_ns"], s["end_ns"])]  # exposed is inside the step
                out["name:" + s["name"]] += iv.length(iv.intersect(span, exposed))
    x.memo["overlap"] = out
    return out


def poor_overlap(x: RuleInput) -> list[Finding]:
    """Communication that runs while compute chips do nothing else (not overlapped)."""
    f = overlap_figures(x)
    if not f["step"] or not f["comm"]:
        return []
    overlap = f["hidden"] / f["comm"]
    if overlap >= POOR_OVERLAP or f["exposed"] / f["step"] < 0.05:
        return []
    if f["chip_comm"] >= f["comm"] / 2:
        return []  # mostly collective kernels on the GPUs: exposed-comm judges them per chip
    names = {k[5:]: v for k, v in f.items() if k.startswith("name:")}
    culprit = min(names, key=lambda k: (-names[k], k))
    return [
        x.finding(
            "poor-overlap",
            culprit,
            {
                "overlap_fraction": round(overlap, 4),
                "comm_share": round(f["comm"] / f["step"], 4),
                "exposed_comm_share": round(f["exposed"] / f["step"], 4),
                "exposed_ms_per_step": ms(f["exposed"] / max(len(x.steps), 1)),
                "steps_sampled": len(x.steps),
            },
            f"only {overlap:.0%} of communication overlaps compute: start {culprit} per bucket during "
            f"backward instead of after it",
            min(f["exposed"], f["compute"]) / max(len(x.steps), 1),  # the most overlap hides
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
            frac,  # a whole-run finding: the share is of spans, and there is no time to save
        )
    ]
