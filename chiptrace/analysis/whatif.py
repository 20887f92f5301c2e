"""What-if replay of a step's dependency graph (stepgraph.py): the step time after a change.

The replay walks the graph in order: a node starts when its gating predecessors have ended
(plus the gap each had), never before work it followed on its chip or link, and an anchored
node (gated by nothing in the trace) at its own start. Unchanged, it gives back the step.

Changes (`Change`):

- `speed`: a chip, or every chip of a type, k times faster: its work takes 1/k the time;
- `bandwidth`: a link, or every link of a type, at a new bandwidth (bytes/s per direction).
  A transfer's time is its route latency plus bytes over its rate; its rate scales with the
  changed link's bandwidth over what that link delivers now (its best moment: the most the
  transfers sharing it moved together, or its fastest transfer in the run, against what
  the best link of its type moved), but never past what the transfer's other hops can
  deliver to it, shared as they were (a faster link behind a saturated one saves nothing);
- `undelay`: chips whose late starts (against the same work on the other chips of their
  type) are removed: a straggler's delay; in a graph of several ranks' steps
  (graphs.py), a rank whose step started later than its peers' (at the collectives it
  ran on that chip) starts with them;
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

import numpy as np

from chiptrace.analysis.graphs import COLLECTIVES
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
    """Per hop the rate its transfer moved at; per link direction what it delivered at
    best; per link what it runs at now (arrays over the graph's hops, built once a graph)."""

    def __init__(self, g: StepGraph, topo: Topology) -> None:
        h = g.hops
        dur = np.fromiter((n.dur for n in g.nodes), np.float64, len(g.nodes))
        nbytes = np.fromiter((n.nbytes for n in g.nodes), np.float64, len(g.nodes))
        links = sorted({d[0] for d in h.dirs})
        self.link_ix = {lk: k for k, lk in enumerate(links)}
        self.dir_link = np.array([self.link_ix[d[0]] for d in h.dirs], np.int64)
        specs = [topo.link(lk) for lk in links]
        lat = np.array([float(sp.latency_ns) if sp else 0.0 for sp in specs])
        d, b = dur[h.owner], nbytes[h.owner]
        moving = np.maximum(d - lat[self.dir_link[h.dir]], d * (1 - _HOP_LATENCY_CAP))
        ok = (b > 0) & (d > 0)
        self.rate = np.where(ok, b / np.where(ok, moving, 1.0) * 1e9, np.nan)  # bytes/s
        dcap = np.zeros(len(h.dirs))
        np.maximum.at(dcap, h.dir[ok], (self.rate * h.conc)[ok])
        # A link's best moment in either direction: one direction may only ever have
        # carried transfers held back elsewhere (a ring's hop behind a degraded link).
        cap = np.zeros(len(links))
        np.maximum.at(cap, self.dir_link, dcap)
        # ... or its best anywhere in the run: where a degraded link holds every transfer
        # of a step's collective, the other links on its path never showed their speed
        # in that step (graphs.iter_graphs reads each link's fastest transfer).
        best_run = g.cache.get("link_best", {})
        cap = np.maximum(cap, [float(best_run.get(lk, 0.0)) for lk in links])
        self.cap = np.where(cap > 0, cap, np.nan)
        util: dict[str, float] = {}
        best: dict[str, float] = defaultdict(float)
        for lk, c, sp in zip(links, cap.tolist(), specs, strict=True):
            nominal = topo.bandwidth(lk)
            if nominal and c > 0:
                util[lk] = c / nominal
                best[sp.type if sp else ""] = max(best[sp.type if sp else ""], util[lk])
        self.now = np.full(len(links), np.nan)
        for lk, u in util.items():
            sp = topo.link(lk)
            top = best[sp.type if sp else ""] or 1.0
            self.now[self.link_ix[lk]] = float(topo.bandwidth(lk) or 0.0) * min(u / top, 1.0)


def rates(g: StepGraph, topo: Topology) -> _Rates:
    """The graph's `_Rates`, built once per graph and topology."""
    key = ("rates", id(topo))
    if key not in g.cache:
        g.cache[key] = _Rates(g, topo)
    r: _Rates = g.cache[key]
    return r


def _matches(keys: Mapping[str, Any] | frozenset[str], ident: str | None, kind: str | None) -> Any:
    if ident is not None and ident in keys:
        return keys[ident] if isinstance(keys, Mapping) else True
    if kind is not None and kind in keys:
        return keys[kind] if isinstance(keys, Mapping) else True
    return None


def _per_dir(g: StepGraph, keys: Mapping[str, Any] | frozenset[str]) -> np.ndarray:
    """Per link direction of the graph's hops, its value in `keys` (by link id or type),
    NaN where none."""
    vals = [_matches(keys, d[0], t) for d, t in zip(g.hops.dirs, g.hops.types, strict=True)]
    return np.array([np.nan if v is None else float(v) for v in vals], np.float64)


def _transfer_durations(g: StepGraph, change: Change, r: _Rates) -> dict[int, float]:
    """New durations of the transfers a bandwidth change touches. A transfer's rate scales
    with its changed links' new bandwidth over what they deliver now (the least of them),
    but a faster link never lifts it past what its other hops delivered to it."""
    h = g.hops
    bw = _per_dir(g, change.bandwidth)[h.dir]
    changed = ~np.isnan(bw)
    if not changed.any():
        return {}
    link = r.dir_link[h.dir]
    now = r.now[link]
    now = np.where(np.isnan(now) | (now <= 0), bw, now)
    scale_h = np.where(changed, bw / np.maximum(now, 1.0), np.inf)
    bounds = h.bounds(len(g.nodes))
    heads = bounds[:-1]
    has = bounds[1:] > heads
    nodes = np.nonzero(has)[0]
    starts = heads[nodes]
    head_rate = r.rate[starts]
    cap = np.where(np.isnan(r.cap[link]), r.rate[heads[h.owner]], r.cap[link])
    bound_h = np.where(changed, np.inf, cap / h.conc)
    scale = np.minimum.reduceat(scale_h, starts)
    bound = np.minimum.reduceat(bound_h, starts)
    pick = np.isfinite(scale) & ~np.isnan(head_rate)
    out: dict[int, float] = {}
    for i, rt, sc, bd in zip(
        nodes[pick].tolist(),
        head_rate[pick].tolist(),
        scale[pick].tolist(),
        bound[pick].tolist(),
        strict=True,
    ):
        n = g.nodes[i]
        new_rate = rt * sc if sc < 1 else max(min(rt * sc, bd), rt)
        lat = n.dur - n.nbytes / rt * 1e9
        out[i] = lat + n.nbytes / new_rate * 1e9
    return out


def _typical_durations(g: StepGraph, links: frozenset[str]) -> dict[int, float]:
    """Transfers over `links` at the step's median duration for their name and size (the
    median over their hops)."""
    if not links:
        return {}
    h = g.hops
    weight = np.zeros(len(g.nodes), np.int64)
    np.add.at(weight, h.owner, h.count)
    durs: dict[tuple[str, float], list[tuple[int, int]]] = defaultdict(list)
    for i, n in enumerate(g.nodes):
        if n.link and weight[i]:
            durs[(n.name, n.nbytes)].append((n.dur, int(weight[i])))
    typical = {k: _weighted_median(v) for k, v in durs.items()}
    hit = ~np.isnan(_per_dir(g, dict.fromkeys(links, 1.0)))[h.dir]
    return {
        i: min(float(g.nodes[i].dur), typical[(g.nodes[i].name, g.nodes[i].nbytes)])
        for i in np.unique(h.owner[hit]).tolist()
    }


def _weighted_median(pairs: list[tuple[int, int]]) -> float:
    """The median of values given as (value, how many times)."""
    pairs = sorted(pairs)
    total = sum(w for _, w in pairs)
    vals = []
    acc = 0
    for v, w in pairs:  # the middle one or two of the expanded list, as statistics.median
        lo, acc = acc, acc + w
        for k in ((total - 1) // 2, total // 2):
            if lo <= k < acc:
                vals.append(v)
    return float(sum(vals) / len(vals))


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
    for k, late in _late_members(g, chips).items():
        for i in g.members[k][2].tolist():
            if g.anchored[i]:
                out[i] = min(out.get(i, float(g.nodes[i].start)), g.nodes[i].start - late)
    return out


def _late_members(g: StepGraph, chips: frozenset[str]) -> dict[int, float]:
    """Ranks' steps of a joined graph whose collectives ran on `chips` (the chip a rank
    arrives late on) and that started later than the median rank's: how much later
    (their whole step starts sooner when undelayed)."""
    if not chips or len(g.members) < 2:
        return {}
    med = statistics.median(m[0] for m in g.members)
    out = {}
    for k, (start, _, idx) in enumerate(g.members):
        mine = (g.nodes[i] for i in idx.tolist())
        at = (n for n in mine if n.name.startswith(COLLECTIVES))
        if start > med and any(_matches(chips, n.chip, n.chip_type) for n in at):
            out[k] = float(start - med)
    return out


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
        for i, d in _transfer_durations(g, change, rates(g, topo)).items():
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


def _member_times(
    g: StepGraph, end: list[float], change: Change | None = None
) -> list[tuple[float, float]]:
    """(measured, replayed) duration of each rank's step of a joined graph (its start to
    the later of its end and its last work's; a late rank undelayed starts sooner), or
    of the graph's one step."""
    if not g.members:
        return [(float(g.duration_ns), _duration(g, end))]
    late = _late_members(g, change.undelay) if change is not None else {}
    ends = np.asarray(end, np.float64)
    was = np.fromiter((n.end for n in g.nodes), np.float64, len(g.nodes))
    out = []
    for k, (start, stop, idx) in enumerate(g.members):
        last = float(was[idx].max()) if len(idx) else float(stop)
        measured = max(float(stop), last) - start
        moved = float(ends[idx].max()) - last if len(idx) else 0.0
        out.append((measured, measured + moved + late.get(k, 0.0)))
    return out


def replay_all(
    graphs: Iterable[StepGraph], changes: Mapping[str, Change], topo: Topology
) -> dict[str, Any]:
    """Measured and replayed step times of many steps (in run order) under several changes
    at once (each graph built once): {"measured": [ns], name: [ns] per change}, one entry
    per step (per rank's step of a joined graph). Work that waited for the step before
    (prefetched input) moves with it."""
    out: dict[str, list[float]] = {"measured": [], **{k: [] for k in changes}}
    carry: dict[str, Carry] = {k: {} for k in changes}
    shift = dict.fromkeys(changes, 0.0)
    for g in graphs:
        if not g.nodes:
            for k in out:
                out[k].append(float(g.duration_ns))
            continue
        out["measured"].extend(was for was, _ in _member_times(g, [n.end for n in g.nodes]))
        for k, c in changes.items():
            end = replay_ends(g, c, topo, carry[k], shift[k])
            out[k].extend(new for _, new in _member_times(g, end, c))
            carry[k] = {
                n.span_id: (n.end, shift[k] + end[i] - n.end)
                for i, n in enumerate(g.nodes)
                if n.span_id
            }
            for a, i in g.alias.items():  # hops merged into a transfer's node
                carry[k][a] = (g.nodes[i].end, shift[k] + end[i] - g.nodes[i].end)
            shift[k] += _duration(g, end) - g.duration_ns
    return out


MAX_STEPS = 64  # steps replayed per workload: evenly spread over the run past this
# The graph holds a node per span of work (Python objects, ~50 us a span to derive) and
# one per transfer (its hops are arrays: an nvl72 step's ~1.8M hops are ~1,400 nodes): a
# step with more spans of work than this is not replayed; `evaluate` says so instead.
MAX_GRAPH_SPANS = 200_000


def spread(n: int, k: int = MAX_STEPS) -> list[int]:
    """Up to `k` step indices evenly spread over `n`."""
    if n <= k:
        return list(range(n))
    if k <= 1:
        return [(n - 1) // 2]  # the middle one
    return sorted({round(i * (n - 1) / (k - 1)) for i in range(k)})


def spread_groups(steps: Any, k: int = MAX_STEPS) -> list[int]:
    """Rows of about `k` steps evenly spread over the run, in whole step groups (every
    rank's copy of a step, steps.step_groups: a replay joins the ranks of a step at their
    collectives), at least one group."""
    from chiptrace.analysis.steps import step_groups

    groups = step_groups(steps)
    if not groups:
        return []
    per = max(1, round(sum(map(len, groups)) / len(groups)))
    return sorted(i for j in spread(len(groups), max(1, k // per)) for i in groups[j])


def p50(values: list[float]) -> float:
    return float(statistics.median(values)) if values else 0.0


def evaluate(
    con: Any, steps: Any, topo: Topology, changes: Mapping[str, Change], stages: Any = None
) -> dict[str, dict[str, float]]:
    """Replay a workload's steps (its `steps` table; at most MAX_STEPS, spread) under each
    change: per change the measured and replayed median step and the saving (ns).
    `stages` (analysis/stages.Stages): the changes replayed as stages (here, or on a cluster)."""
    from chiptrace.analysis.graphs import iter_graphs

    if too_big(con, steps):
        return {}
    if stages is not None:
        r = stages.replays(steps, spread_groups(steps), changes, topo)
    else:
        r = replay_all(iter_graphs(con, steps, spread_groups(steps)), changes, topo)
    m = p50(r["measured"])
    return {
        k: {"steps": len(v), "measured_ns": m, "replayed_ns": p50(v), "saving_ns": m - p50(v)}
        for k, v in r.items()
        if k != "measured"
    }


def too_big(con: Any, steps: Any) -> bool:
    """Whether the workload's steps average more than MAX_GRAPH_SPANS spans of work (link
    hops are not counted: they become one node per transfer)."""
    if not steps.num_rows:
        return True
    lo = min(steps.column("start_ns").to_pylist())
    hi = max(steps.column("end_ns").to_pylist())
    n = con.sql(
        f"SELECT count(*) FROM spans_raw WHERE start_ns >= {int(lo)} AND start_ns <= {int(hi)} "
        "AND link_id IS NULL"
    ).fetchall()[0][0]
    return bool(n / steps.num_rows > MAX_GRAPH_SPANS)
