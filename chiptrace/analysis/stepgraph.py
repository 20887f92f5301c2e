"""Each step as a dependency graph: the input to the what-if replay (whatif.py).

A node is a leaf span (the work that ran: an op on a chip, one hop of a transfer, an
untagged leaf), or a zero-length join where many spans gate many (a collective's round, a
phase boundary). An edge says "this could not start before that ended"; only edges that the
timing confirms (the predecessor ended at most `slack` before the span started) are kept as
gating edges, each with its gap, so replaying the graph unchanged gives back the step.

Where the edges come from, for emulated, collected and imported traces alike:

- order of work on each chip, and on each link direction (a stream, a thread, a DMA queue);
- OTel links: a span links to what it waited on (a transfer, a launch);
- a transfer joined to its producer (work on its source chip that ended as it started) and
  its consumer (work on its destination chip that started as it ended);
- collectives joining the ranks: transfers under one parent (a bucket's ring rounds) start
  when the round before them ended on every rank;
- span nesting: work under a phase waits for the earlier phases of its ancestors (a bucket
  for the backward layers that filled it; the optimizer for the all-reduce);
- CPU launches joined to their kernels (a `launch` link).

A span with no gating predecessor started when something outside the trace let it (a
request arriving, a straggler's delay): it is anchored at its start, and the replay never
moves it earlier unless the change removes that delay.

Built per step from that step's spans (`build`), and streamed over a workload's steps
(graphs.iter_graphs), a few steps' spans in memory at a time. Cost: O(n log n) per step.
"""

from __future__ import annotations

import bisect
import heapq
from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from chiptrace.analysis import hops as hop_table
from chiptrace.analysis.critical_path import link_span_ids
from chiptrace.analysis.hops import Hops
from chiptrace.analysis.stepnodes import (
    JOIN,
    MIN_SLACK_NS,
    Builder,
    Extra,
    Node,
    StepGraph,
    slack_of,
)
from chiptrace.topology import Topology


class _Latest:
    """Nodes of one key sorted by end: the latest that ended by a time, and the ones that
    ended within a window."""

    def __init__(self, nodes: list[Node], members: list[int]) -> None:
        self.order = sorted(members, key=lambda i: nodes[i].end)
        self.ends = [nodes[i].end for i in self.order]

    def latest(self, nodes: list[Node], s: int, bound: int) -> int | None:
        k = bisect.bisect_right(self.ends, bound) - 1
        while k >= 0 and (self.order[k] == s or nodes[self.order[k]].start >= nodes[s].start):
            k -= 1
        return self.order[k] if k >= 0 else None

    def within(self, t: int, slack: int) -> list[int]:
        lo = bisect.bisect_left(self.ends, t - slack)
        return self.order[lo : bisect.bisect_right(self.ends, t)]


def _pairs(h: Hops, end: int, chips: set[str]) -> list[tuple[int, str]]:
    """(transfer node, chip) for each chip among `chips` that its hops leave from (end 1)
    or arrive at (end 2), each pair once (NumPy: a step has ~1.8M hops)."""
    names = sorted(chips)
    code = {c: k for k, c in enumerate(names)}
    per_dir = np.array([code.get(d[end], -1) for d in h.dirs], np.int64)
    at = per_dir[h.dir] if len(h) else np.zeros(0, np.int64)
    ok = at >= 0
    pairs = np.unique(h.owner[ok] * max(len(names), 1) + at[ok])
    return [(int(p) // len(names), names[int(p) % len(names)]) for p in pairs.tolist()]


class _Edges:
    """The gating predecessors of every leaf of a `Builder`."""

    def __init__(self, b: Builder) -> None:
        self.b = b
        nodes = b.nodes
        groups: dict[Any, list[int]] = defaultdict(list)
        for i, n in enumerate(nodes):
            if n.chip and not n.link:
                groups[("chip", n.chip)].append(i)
        self.res = {k: _Latest(nodes, v) for k, v in groups.items()}
        chips = {k[1] for k in groups}
        # A transfer's chips: where its hops leave (its producers) and arrive (consumers).
        h = b.hops
        self.srcs: dict[int, set[str]] = defaultdict(set)
        for o, chip in _pairs(h, 1, chips):
            self.srcs[o].add(chip)
        dst: dict[str, set[int]] = defaultdict(set)
        for o, chip in _pairs(h, 2, chips):
            dst[chip].add(o)
        # A collective round (transfers under one parent that start together) ends with
        # its last transfer: what reads its result waits for that one.
        rounds: dict[tuple[Any, int], list[int]] = defaultdict(list)
        for i, n in enumerate(nodes):
            if n.link:
                rounds[(b.parent.get(n.span_id), n.start)].append(i)
        self.round_last = {
            i: max(v, key=lambda k: nodes[k].end) for v in rounds.values() for i in v
        }
        self.into = {k: _Latest(nodes, sorted(v)) for k, v in dst.items()}
        self.joins: dict[tuple[Any, ...], list[int]] = {}
        self.preds: list[dict[int, int]] = [{} for _ in nodes]
        self.after: list[set[int]] = [set() for _ in nodes]
        self.join_of: list[tuple[Any, ...] | None] = [None] * len(nodes)
        start = np.fromiter((n.start for n in nodes), np.int64, len(nodes))
        end = np.fromiter((n.end for n in nodes), np.int64, len(nodes))
        slack = np.maximum(MIN_SLACK_NS, (end - start) // 100)
        # the order of transfers on each link direction (a link is shared, not serial: only
        # what gated a transfer binds it), from the hops at once
        for i, j, gap in hop_table.order_edges(h, start, end, slack):
            self.preds[i][j] = gap
        for i in range(len(nodes)):
            self._derive(i)

    def _add(self, i: int, j: int | None, order: bool = True) -> None:
        """j gated i if it ended within the slack before; else, with `order`, i only
        follows it (a chip's earlier work: it matters when a change slows that work)."""
        if j is None or j == i:
            return
        s, p = self.b.nodes[i], self.b.nodes[j]
        if p.start >= s.start:
            return
        gap = s.start - p.end
        if gap <= slack_of(s):
            self.preds[i][j] = gap
        elif order:
            self.after[i].add(j)

    def _derive(self, i: int) -> None:
        b, n = self.b, self.b.nodes[i]
        slack = slack_of(n)
        if n.chip and not n.link:  # the chip's work before it, in order
            self._add(i, self.res[("chip", n.chip)].latest(b.nodes, i, n.start + slack))
        for lid in link_span_ids(b.rows[n.span_id].get("links")):
            lid = b.alias.get(lid, lid)
            if lid in b.rows:
                self._add(i, b.last_leaf(lid))
        if n.chip and n.chip in self.into:  # the transfers that delivered its input
            for j in self.into[n.chip].within(n.start, slack):
                self._add(i, j)
            last = self.into[n.chip].latest(b.nodes, i, n.start + slack)
            if last is not None and n.start - b.nodes[self.round_last[last]].end <= slack:
                self._add(i, self.round_last[last])  # ... and the rest of its round
        for src in self.srcs.get(i, ()):  # the work that produced it (any hop's source)
            for j in self.res[("chip", src)].within(n.start, slack):
                self._add(i, j)
        parent = b.parent.get(n.span_id)
        jkey = (parent, n.start, bool(n.link))
        if jkey not in self.joins:
            self.joins[jkey] = self._join(n, parent, slack)
        if self.joins[jkey]:
            self.join_of[i] = jkey

    def _join(self, n: Node, parent: str | None, slack: int) -> list[int]:
        """What gated every leaf of `parent` that started at n.start: the round before it
        (a collective's transfers under one parent) and the earlier phases of its
        ancestors (program order), each the latest to end."""
        b = self.b
        chain = [parent, *b.ancestors(parent)] if parent else []
        pos = {a: k for k, a in enumerate(chain)}
        out = []
        for j in b.ending_near(n.start, slack):
            m = b.nodes[j]
            if m.start >= n.start:
                continue
            mc, a = m.span_id, b.parent.get(m.span_id)
            while a is not None and a not in pos:
                mc, a = a, b.parent.get(a)
            if a is None:
                continue
            k = pos[a]
            sc = chain[k - 1] if k > 0 else None  # None: n itself, a leaf under `a`
            if sc is None and mc == m.span_id:  # two leaves of one parent
                if n.link and m.link:
                    out.append(j)  # a collective's earlier round
                continue
            sc_start = n.start if sc is None else int(b.rows[sc]["start_ns"])
            if int(b.rows[mc]["start_ns"]) < sc_start:
                out.append(j)
        return out


def build(
    rows: Iterable[Mapping[str, Any]],
    root_id: str | None = None,
    hops: Hops | None = None,
    alias: dict[str, str] | None = None,
    extra: Extra | None = None,
) -> StepGraph:
    """The dependency graph of one step.

    Args:
        rows: the step's spans as mappings (steps.Step.spans): span_id, parent_span_id,
            name, start_ns, end_ns, chip_id, chip_type, link_id, link_type, link_src,
            link_dst, op_bytes, links.
        root_id: the step's root span (default: the longest span without a parent).
        hops, alias: the transfers already grouped (hops.load: rows then hold one span per
            transfer); default: the leaf link spans of `rows` grouped here.
        extra: adds nodes and edges before the graph is ordered (nodes, preds, after:
            graphs.join_collectives joins the ranks of a step at their collectives).
    """
    rows = list(rows)
    if not rows:
        return StepGraph("", "", 0, 0)
    if root_id is None:
        ids = {r["span_id"] for r in rows}
        tops = [r for r in rows if (r.get("parent_span_id") or None) not in ids]
        root_id = max(tops, key=lambda r: int(r["end_ns"]) - int(r["start_ns"]))["span_id"]
    b = Builder(rows, root_id, hops, alias)
    root = b.rows.get(root_id or "")
    e = _Edges(b)
    nodes = list(b.nodes)
    preds = _rounds(b, [dict(p) for p in e.preds])
    after = [set(a) for a in e.after]
    join_index: dict[Any, int] = {}
    for i, jkey in enumerate(e.join_of):
        if jkey is None:
            continue
        members = e.joins[jkey]
        if len(members) == 1:
            preds[i].setdefault(members[0], nodes[i].start - nodes[members[0]].end)
            continue
        if jkey not in join_index:
            join_index[jkey] = len(nodes)
            t = nodes[i].start
            nodes.append(Node(JOIN, t, t))
            preds.append({j: t - nodes[j].end for j in members})
            after.append(set())
        preds[i][join_index[jkey]] = 0
    if extra is not None:
        extra(nodes, preds, after)
    order = _topological(nodes, preds, after)
    new = {old: k for k, old in enumerate(order)}
    b.hops.renumber([new[i] for i in range(len(nodes))])
    ordered = [nodes[i] for i in order]
    hop_table.crowding(
        b.hops,
        np.fromiter((n.start for n in ordered), np.int64, len(ordered)),
        np.fromiter((n.end for n in ordered), np.int64, len(ordered)),
    )
    lo = int(root["start_ns"]) if root else min(n.start for n in nodes)
    hi = int(root["end_ns"]) if root else lo
    hi = max([hi, *(n.end for n in nodes)])
    return StepGraph(
        trace_id=str((root or rows[0]).get("trace_id") or ""),
        name=str((root or rows[0]).get("name") or ""),
        start_ns=lo,
        end_ns=hi,
        nodes=ordered,
        preds=[sorted((new[j], g) for j, g in preds[i].items()) for i in order],
        after=[sorted(new[j] for j in after[i] - preds[i].keys()) for i in order],
        anchored=[not preds[i] and nodes[i].name != JOIN for i in order],
        external={
            new[i]: ext
            for i in range(len(b.nodes))
            if (
                ext := [
                    x
                    for x in link_span_ids(b.rows[nodes[i].span_id].get("links"))
                    if x not in b.rows and x not in b.alias
                ]
            )
        },
        hops=b.hops,
        alias={a: new[b.index[r]] for a, r in b.alias.items() if r in b.index},
    )


def _topological(
    nodes: list[Node], preds: list[dict[int, int]], after: list[set[int]]
) -> list[int]:
    """Node indices in start order (a join before the work it gates at the same time),
    every predecessor first: zero-length nodes at one time (a rank's arrival at a
    collective, the join of the arrivals) are ordered by their edges, not their names."""
    succ: list[list[int]] = [[] for _ in nodes]
    need = [0] * len(nodes)
    for i in range(len(nodes)):
        for j in {*preds[i], *after[i]}:
            succ[j].append(i)
            need[i] += 1
    key = [(n.start, n.name != JOIN, i) for i, n in enumerate(nodes)]
    ready = [key[i] for i in range(len(nodes)) if not need[i]]
    heapq.heapify(ready)
    out = []
    while ready:
        *_, i = heapq.heappop(ready)
        out.append(i)
        for k in succ[i]:
            need[k] -= 1
            if not need[k]:
                heapq.heappush(ready, key[k])
    if len(out) < len(nodes):  # a cycle (clock skew between hosts): start order for the rest
        out += sorted(set(range(len(nodes))) - set(out), key=lambda i: key[i])
    return out


def _rounds(b: Builder, preds: list[dict[int, int]]) -> list[dict[int, int]]:
    """Transfers under one parent that start together are one round of a collective: each
    waits for whatever gated any of them (the last rank to produce its data)."""
    rounds: dict[tuple[Any, int], list[int]] = defaultdict(list)
    for i, n in enumerate(b.nodes):
        if n.link:
            rounds[(b.parent.get(n.span_id), n.start)].append(i)
    for members in rounds.values():
        if len(members) < 2:
            continue
        union: dict[int, int] = {}
        for i in members:
            union.update(preds[i])
        if union:
            for i in members:
                preds[i] = {**union, **preds[i]}
    return preds


def topology_of(tables: Any) -> Topology:
    """The run's topology (nominal figures), from the analysis tables."""
    topo: Topology = tables.topology
    return topo


__all__ = ["JOIN", "MIN_SLACK_NS", "Node", "StepGraph", "build", "topology_of"]
