"""What-if replay of a step's dependency graph (stepgraph.py): the step time after a change.

The replay walks the graph in order: a node starts when its gating predecessors have ended
(plus the gap each had), never before work it followed on its chip or link, and an anchored
node (gated by nothing in the trace) at its own start. Unchanged, it gives back the step.

Changes (`Change`):

- `speed`: a chip, or every chip of a type, k times faster: its work takes 1/k the time;
- `bandwidth`: a link, or every link of a type, at a new bandwidth (bytes/s per direction).
  A transfer's time is its route latency plus bytes over its rate; its rate scales with the
  changed link's bandwidth over what that link delivers now (its best moment: the most the
  transfers sharing it moved together, against what the best link of its type moved), but
  never past what the transfer's other hops delivered to it (a faster link behind a
  saturated one saves nothing);
- `undelay`: chips whose late starts (against the same work on the other chips of their
  type) are removed: a straggler's delay;
- `typical`: links whose transfers take their typical time again (the step's median for
  the same name and size): traffic a downed or flapping link slowed.

Daydream (USENIX ATC 2020) predicts optimizations this way from one profile; here the
emulator can check it (benchmarks/bench_culprits.py re-runs the fault-free run).
"""

from __future__ import annotations

import bisect
import statistics
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from chiptrace.analysis.metrics import HOST_COLLECTIVE
from chiptrace.analysis.stepgraph import JOIN, Node, StepGraph
from chiptrace.topology import Topology

_HOP_LATENCY_CAP = 0.9  # a transfer's latency is at most this share of its time


@dataclass(frozen=True)
class Change:
    """One what-if: keys are chip/link ids or chip/link types."""

    speed: Mapping[str, float] = field(default_factory=dict)
    bandwidth: Mapping[str, float] = field(default_factory=dict)
    undelay: frozenset[str] = frozenset()
    typical: frozenset[str] = frozenset()

    def __bool__(self) -> bool:
        return bool(self.speed or self.bandwidth or self.undelay or self.typical)


class _Rates:
    """Per link direction what it delivered at best, and per link what it runs at now."""

    def __init__(self, g: StepGraph, topo: Topology) -> None:
        self.topo = topo
        self.dcap: dict[tuple[str, str, str], float] = {}
        util: dict[str, float] = {}
        for n in g.nodes:
            r = self.rate(n)
            if r is None:
                continue
            d = _dir(n)
            self.dcap[d] = max(self.dcap.get(d, 0.0), r * n.concurrency)
        # A link's best moment in either direction: one direction may only ever have
        # carried transfers held back elsewhere (a ring's hop behind a degraded link).
        self.cap: dict[str, float] = {}
        for (link, _, _), cap in self.dcap.items():
            self.cap[link] = max(self.cap.get(link, 0.0), cap)
        best: dict[str, float] = defaultdict(float)
        for link, cap in self.cap.items():
            nominal = topo.bandwidth(link)
            if nominal:
                util[link] = max(util.get(link, 0.0), cap / nominal)
        for link, u in util.items():
            spec = topo.link(link)
            best[spec.type if spec else ""] = max(best[spec.type if spec else ""], u)
        self.now: dict[str, float] = {}
        for link, u in util.items():
            spec = topo.link(link)
            top = best[spec.type if spec else ""] or 1.0
            self.now[link] = float(topo.bandwidth(link) or 0.0) * min(u / top, 1.0)

    def latency(self, n: Node) -> float:
        spec = self.topo.link(n.link)
        return float(spec.latency_ns) if spec else 0.0

    def rate(self, n: Node) -> float | None:
        """Bytes/s the transfer moved (its time less the latency)."""
        if not n.link or n.nbytes <= 0 or n.dur <= 0:
            return None
        moving = max(n.dur - self.latency(n), n.dur * (1 - _HOP_LATENCY_CAP))
        return n.nbytes / moving * 1e9


def _dir(n: Node) -> tuple[str, str, str]:
    return (n.link or "", n.src or "", n.dst or "")


def _matches(keys: Mapping[str, Any] | frozenset[str], ident: str | None, kind: str | None) -> Any:
    if ident is not None and ident in keys:
        return keys[ident] if isinstance(keys, Mapping) else True
    if kind is not None and kind in keys:
        return keys[kind] if isinstance(keys, Mapping) else True
    return None


def _transfer_durations(g: StepGraph, change: Change, rates: _Rates) -> dict[int, float]:
    """New durations of the transfers a bandwidth change touches (every hop of each)."""
    hops: dict[int, list[int]] = defaultdict(list)
    for i, n in enumerate(g.nodes):
        if n.link and n.group >= 0:
            hops[n.group].append(i)
    out: dict[int, float] = {}
    for members in hops.values():
        nodes = [g.nodes[i] for i in members]
        new_bw = [
            (n, _matches(change.bandwidth, n.link, n.link_type))
            for n in nodes
            if _matches(change.bandwidth, n.link, n.link_type) is not None
        ]
        if not new_bw:
            continue
        head = nodes[0]
        r = rates.rate(head)
        if r is None:
            continue
        scale = min(bw / max(rates.now.get(n.link or "", 0.0) or bw, 1.0) for n, bw in new_bw)
        changed = {id(n) for n, _ in new_bw}
        bound = min(
            (rates.cap.get(n.link or "", r) / n.concurrency for n in nodes if id(n) not in changed),
            default=float("inf"),
        )
        new_rate = r * scale if scale < 1 else max(min(r * scale, bound), r)
        lat = head.dur - head.nbytes / r * 1e9
        dur = lat + head.nbytes / new_rate * 1e9
        for i in members:
            out[i] = dur
    return out


def _typical_durations(g: StepGraph, links: frozenset[str]) -> dict[int, float]:
    """Transfers over `links`, and the transfers they belong to, at the step's median
    duration for their name and size."""
    if not links:
        return {}
    durs: dict[tuple[str, float], list[int]] = defaultdict(list)
    for n in g.nodes:
        if n.link:
            durs[(n.name, n.nbytes)].append(n.dur)
    typical = {k: statistics.median(v) for k, v in durs.items()}
    groups = {n.group for n in g.nodes if n.link and _matches(links, n.link, n.link_type)}
    return {
        i: min(float(n.dur), typical[(n.name, n.nbytes)])
        for i, n in enumerate(g.nodes)
        if n.link and n.group in groups
    }


def _owner(n: Node) -> str | None:
    """The chip a node's delay belongs to: its chip, or a transfer's destination."""
    return n.chip or n.dst


def _waits(g: StepGraph) -> list[float]:
    """How long each node started after everything it follows had ended, and after its
    chip last finished work (a batch's input waiting on a free device)."""
    ends = [n.end for n in g.nodes]
    free: dict[str, list[int]] = defaultdict(list)
    for n in g.nodes:
        if n.chip and not n.link:
            free[n.chip].append(n.end)
    for v in free.values():
        v.sort()
    out = []
    for i, n in enumerate(g.nodes):
        before = [ends[j] for j, _ in g.preds[i]] + [ends[j] for j in g.after[i]]
        own = free.get(_owner(n) or "", [])
        k = bisect.bisect_right(own, n.start) - 1
        if k >= 0:
            before.append(own[k])
        out.append(float(n.start - max(before, default=g.start_ns)))
    return out


def _peer_offsets(g: StepGraph, chips: frozenset[str]) -> dict[int, float]:
    """Anchored work on `chips` (or transfers into them) started sooner: by how much longer
    it waited than the median of the same work on the other chips of the type."""
    if not chips:
        return {}
    waits = _waits(g)
    peers: dict[tuple[str, str], list[float]] = defaultdict(list)
    for i, n in enumerate(g.nodes):
        own = _owner(n)
        if own and not _matches(chips, own, None):
            peers[(n.name, own.split(":", 1)[0])].append(waits[i])
    out = {}
    for i, n in enumerate(g.nodes):
        own = _owner(n)
        if not (g.anchored[i] and own and _matches(chips, own, n.chip_type)):
            continue
        same = peers.get((n.name, own.split(":", 1)[0]))
        if same:
            out[i] = n.start - max(waits[i] - statistics.median(same), 0.0)
    return out


COLLECTIVES = (*HOST_COLLECTIVE, "ncclKernel", "ncclDevKernel", "rccl")


def durations(g: StepGraph, change: Change, topo: Topology) -> list[float]:
    """Every node's duration under the change."""
    dur = [float(n.dur) for n in g.nodes]
    for i, n in enumerate(g.nodes):
        # A collective (an NCCL kernel, the host's gloo:all_reduce) lasts until its peers
        # arrive: a faster chip does not shorten the wait.
        if n.link or n.name == JOIN or n.name.startswith(COLLECTIVES):
            continue
        k = _matches(change.speed, n.chip, n.chip_type)
        if k:
            dur[i] = n.dur / float(k)
    for i, d in _typical_durations(g, change.typical).items():
        dur[i] = d
    if change.bandwidth:
        for i, d in _transfer_durations(g, change, _Rates(g, topo)).items():
            dur[i] = d
    return dur


Carry = dict[str, tuple[int, float]]  # span id -> (its end, how much later it ends now)


def replay_ends(
    g: StepGraph, change: Change, topo: Topology, carry: Carry | None = None, shift: float = 0.0
) -> list[float]:
    """Every node's end (ns) with `change` applied. `carry`: the step before's nodes (their
    end, and how much later they end after the change, on a timeline where this step
    starts `shift` later): work here that waited for one of them moves with it."""
    dur = durations(g, change, topo)
    moved = _peer_offsets(g, change.undelay)
    end = [0.0] * len(g.nodes)
    for i, n in enumerate(g.nodes):
        t = moved.get(i, float(n.start)) if g.anchored[i] else float("-inf")
        if carry and i in g.external:
            t = _carried(n, g.external[i], carry, shift, t)
        for j, gap in g.preds[i]:
            t = max(t, end[j] + gap)
        for j in g.after[i]:
            t = max(t, end[j])
        end[i] = max(t, g.floor.get(i, t)) + dur[i]
    return end


def _carried(n: Node, ids: list[str], carry: Carry, shift: float, t: float) -> float:
    """The start of `n` when it waited (ended within the slack) for work of the step
    before that now ends earlier or later."""
    got = [carry[s] for s in ids if s in carry]
    if not got:
        return t
    end, later = max(got)
    if n.start - end > max(2_000, n.dur // 100):
        return t  # it did not wait for that work
    return max(n.start + later - shift, float("-inf") if t == float("-inf") else -1e30)


def replay(g: StepGraph, change: Change, topo: Topology) -> float:
    """The step's duration (ns) with `change` applied; unchanged, its measured duration."""
    if not g.nodes:
        return float(g.duration_ns)
    return _duration(g, replay_ends(g, change, topo))


def _duration(g: StepGraph, end: list[float]) -> float:
    last = max(n.end for n in g.nodes)
    return g.duration_ns + (max(end) - last)


def replay_all(
    graphs: Iterable[StepGraph], changes: Mapping[str, Change], topo: Topology
) -> dict[str, Any]:
    """Measured and replayed step times of many steps (in run order) under several changes
    at once (each graph built once): {"measured": [ns], name: [ns] per change}. Work that
    waited for the step before (prefetched input) moves with it."""
    out: dict[str, list[float]] = {"measured": [], **{k: [] for k in changes}}
    carry: dict[str, Carry] = {k: {} for k in changes}
    shift = dict.fromkeys(changes, 0.0)
    for g in graphs:
        out["measured"].append(float(g.duration_ns))
        for k, c in changes.items():
            if not g.nodes:
                out[k].append(float(g.duration_ns))
                continue
            end = replay_ends(g, c, topo, carry[k], shift[k])
            d = _duration(g, end)
            out[k].append(d)
            carry[k] = {
                n.span_id: (n.end, shift[k] + end[i] - n.end)
                for i, n in enumerate(g.nodes)
                if n.span_id
            }
            shift[k] += d - g.duration_ns
    return out


MAX_STEPS = 64  # steps replayed per workload: evenly spread over the run past this
# The graph is built in Python (~50 us a span): a step past this many spans is not replayed
# (an nvl72 step has ~2M transfer hops); `evaluate` says so instead.
MAX_GRAPH_SPANS = 200_000


def spread(n: int, k: int = MAX_STEPS) -> list[int]:
    """Up to `k` step indices evenly spread over `n`."""
    if n <= k:
        return list(range(n))
    return sorted({round(i * (n - 1) / (k - 1)) for i in range(k)})


def p50(values: list[float]) -> float:
    return float(statistics.median(values)) if values else 0.0


def evaluate(
    con: Any, steps: Any, topo: Topology, changes: Mapping[str, Change], stages: Any = None
) -> dict[str, dict[str, float]]:
    """Replay a workload's steps (its `steps` table; at most MAX_STEPS, spread) under each
    change: per change the measured and replayed median step and the saving (ns).
    `stages` (analysis/stages.Stages): the changes replayed as stages (here, or on a cluster)."""
    from chiptrace.analysis.stepgraph import iter_graphs

    if too_big(con, steps):
        return {}
    if stages is not None:
        r = stages.replays(steps, spread(steps.num_rows), changes, topo)
    else:
        r = replay_all(iter_graphs(con, steps, spread(steps.num_rows)), changes, topo)
    m = p50(r["measured"])
    return {
        k: {"steps": len(v), "measured_ns": m, "replayed_ns": p50(v), "saving_ns": m - p50(v)}
        for k, v in r.items()
        if k != "measured"
    }


def too_big(con: Any, steps: Any) -> bool:
    """Whether the workload's steps average more than MAX_GRAPH_SPANS spans."""
    if not steps.num_rows:
        return True
    lo = min(steps.column("start_ns").to_pylist())
    hi = max(steps.column("end_ns").to_pylist())
    n = con.sql(
        f"SELECT count(*) FROM spans_raw WHERE start_ns >= {int(lo)} AND start_ns <= {int(hi)}"
    ).fetchall()[0][0]
    return bool(n / steps.num_rows > MAX_GRAPH_SPANS)
