"""Rules about communication: latency-bound transfers, poor overlap, dropped spans."""

from __future__ import annotations

import functools
import statistics
from collections import defaultdict

from chiptrace.analysis import steps as iv
from chiptrace.analysis.findings import Finding
from chiptrace.analysis.metrics import HOST_COLLECTIVE
from chiptrace.analysis.rule_input import RuleInput, ms
from chiptrace.analysis.tables import COMPUTE_TYPES

LATENCY_DOMINATES = 0.5  # latency at least half of a typical transfer's time
SMALL_MESSAGE = 64 * 1024  # without a topology: "small" means under 64 KiB
MANY = 50
POOR_OVERLAP = 0.30  # under 30% of communication hidden behind compute


@functools.lru_cache(maxsize=65536)
def _chip_type(chip: str | None) -> str:
    return (chip or "").rsplit("/", 1)[-1].split(":")[0]


def _small_below(x: RuleInput, link_id: str) -> tuple[float, float | None, float | None]:
    """(bytes under which a transfer on this link is mostly latency, the link's latency in
    ns, its bandwidth in bytes/s): where the topology gives both, the size whose wire time
    equals the latency (latency x bandwidth); else SMALL_MESSAGE, the rest unknown."""
    t = x.tables
    spec = t.topology.link(link_id)
    bw = t.topology.bandwidth(link_id)
    if spec is not None and spec.latency_ns and bw:
        return spec.latency_ns * bw / 1e9, float(spec.latency_ns), bw
    return float(SMALL_MESSAGE), None, None


def _latency(r: dict, lat: float | None, bw: float | None) -> float:
    """A size class's fixed cost per transfer: its shortest transfer less the wire time of
    the class's smallest size (a transfer over a route pays every hop's latency, so this is
    at least the link's own), else the shortest transfer (a floor)."""
    if lat is None or bw is None:
        return float(r["min_ns"])
    return max(lat, r["min_ns"] - 2.0 ** r["size_class"] / bw * 1e9)


def _small_transfers(x: RuleInput) -> dict[tuple[str, str], dict[str, float]]:
    """Per (link type, name) of this workload's links: all transfers and the small ones,
    each classified by its own size class against its link (`_small_below`); their time;
    and `lost`, what one batched transfer per link direction would save: the latency of
    each small transfer (`_latency`), at most the time they took."""
    names = {r["link_id"]: (r["link_type"], r["name"]) for r in x.link_rows()}
    per: dict[tuple[str, str], dict[str, float]] = defaultdict(lambda: defaultdict(float))
    dirs: dict[tuple[str, str], dict[tuple, list[float]]] = defaultdict(dict)
    sizes = x.tables.link_sizes
    for r in sizes.to_pylist() if sizes.num_rows else []:
        if r["link_id"] not in names:
            continue
        key = names[r["link_id"]]
        g = per[key]
        below, lat, bw = _small_below(x, r["link_id"])
        g["transfers"] += r["transfers"]
        g["ns"] += r["span_ns"]
        if r["size_class"] < 0 or 2.0 ** (r["size_class"] + 1) > below:
            continue
        g["small"] += r["transfers"]
        g["small_ns"] += r["span_ns"]
        g["small_bytes"] += r["bytes"]
        g["below"], g["topology"] = below, float(lat is not None)
        # per direction: [small transfers, their time, fixed cost per transfer]
        d = dirs[key].setdefault((r["link_id"], r["link_src"], r["link_dst"]), [0, 0, 1e30])
        d[0] += r["transfers"]
        d[1] += r["span_ns"]
        d[2] = min(d[2], _latency(r, lat, bw))
    for key, ds in dirs.items():
        per[key]["lost"] = sum(min(n * lat, t) for n, t, lat in ds.values())
        per[key]["latency_ns"] = statistics.median(lat for _, _, lat in ds.values())
        per[key]["dirs"] = len(ds)
    return per


def latency_bound(x: RuleInput) -> list[Finding]:
    """Many small transfers whose time is mostly link latency, not bytes. Each transfer
    is small or not by its own size (against its link's latency x bandwidth, else 64 KiB),
    and the saving is only the small ones' latency: batching bulk copies saves nothing."""
    out = []
    for (ltype, name), g in _small_transfers(x).items():
        n, small = int(g["transfers"]), int(g["small"])
        if small < MANY or not g["small_ns"]:
            continue
        share = g["lost"] / g["small_ns"]
        if share < LATENCY_DOMINATES:
            continue
        lat = g["latency_ns"]
        src = "the topology and the shortest transfer" if g["topology"] else "the shortest transfer"
        out.append(
            x.finding(
                "latency-bound",
                f"{name} on {ltype}",
                {
                    "transfers": n,
                    "small_transfers": small,
                    "small_below_bytes": int(g["below"]),
                    "small_mean_bytes": round(g["small_bytes"] / small, 1),
                    "small_ms": ms(g["small_ns"]),
                    "other_ms": ms(g["ns"] - g["small_ns"]),
                    "latency_us": round(lat / 1e3, 3),
                    "latency_from": src,
                    "latency_share": round(share, 4),
                    "links": int(g["dirs"]),
                },
                f"{small} of {n} transfers are under {int(g['below']) / 1024:,.0f} KiB and spend "
                f"{share:.0%} of their time in latency (~{lat / 1e3:.3g} us each): batch them "
                f"into larger messages (bigger buckets, fused all-reduce, one copy of a "
                f"stacked tensor)",
                # the link directions work in parallel: one direction's share, per step
                g["lost"] / max(g["dirs"], 1) / x.n_steps,
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
            _host_figures(st, out)
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


def _host_figures(st: iv.Step, out: dict[str, float]) -> None:
    """A step with no GPU/NPU work (PyTorch on CPU, gloo): its collectives' time on the
    host (comm spans, or the profiler's `gloo:all_reduce`...) against the step's, as
    host_comm, host_exposed (not under other host work) and host_step."""
    comm_spans = [
        s
        for s in st.spans
        if s["span_id"] != st.root_id
        and (s["op_kind"] == "comm" or (s["name"] or "").startswith(HOST_COLLECTIVE))
    ]
    if not comm_spans:
        return
    ids = {s["span_id"] for s in comm_spans}
    comm = st.busy(comm_spans)
    work = st.busy(
        s
        for s in st.leaves()
        if s["span_id"] not in ids
        and s["chip_type"] in ("cpu", None)
        and not s["link_id"]
        and s["span_id"] != st.root_id
        and (s["parent_span_id"] not in ids)
    )
    out["host_comm"] += iv.length(comm)
    out["host_exposed"] += iv.length(iv.subtract(comm, work))
    out["host_step"] += st.duration_ns


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
