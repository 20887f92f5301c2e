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
(`iter_graphs`), a few steps' spans in memory at a time. Cost: O(n log n) per step.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from chiptrace.analysis.critical_path import link_span_ids
from chiptrace.analysis.steps import load_steps
from chiptrace.topology import Topology

MIN_SLACK_NS = 2_000  # a predecessor that ended this close before a span started gated it
JOIN = "(join)"


@dataclass(slots=True)
class Node:
    """One leaf span (or a join) of a step graph; times in ns."""

    name: str
    start: int
    end: int
    chip: str | None = None
    chip_type: str | None = None
    link: str | None = None
    link_type: str | None = None
    src: str | None = None
    dst: str | None = None
    nbytes: float = 0.0
    span_id: str = ""
    group: int = -1  # transfers: hops of one transfer share a group
    concurrency: int = 1  # transfers on the same link direction at this one's midpoint

    @property
    def dur(self) -> int:
        return self.end - self.start


@dataclass
class StepGraph:
    """One step: nodes in topological order, their gating predecessors and anchors.

    Attributes:
        trace_id, name: the step's trace and root span name.
        start_ns, end_ns: the step's measured bounds (root start, the later of the root's
            end and its last work's end).
        nodes: leaf spans and joins, ordered so every predecessor comes first.
        preds: per node, (predecessor index, gap ns) of the edges that gated its start.
        after: per node, predecessors it must follow but that did not gate it (a chip's
            earlier work that ended long before): they matter only when a change slows them.
        anchored: per node, True where nothing in the trace gated its start.
        floor: nodes that may not start before a time, whatever the change (a batch's
            first work waits for its last request to arrive).
        external: per node, the span ids it links to in other steps (input prefetched
            during the step before): the replay of consecutive steps carries them over.
    """

    trace_id: str
    name: str
    start_ns: int
    end_ns: int
    nodes: list[Node] = field(default_factory=list)
    preds: list[list[tuple[int, int]]] = field(default_factory=list)
    after: list[list[int]] = field(default_factory=list)
    anchored: list[bool] = field(default_factory=list)
    floor: dict[int, int] = field(default_factory=dict)  # never starts before (ns)
    external: dict[int, list[str]] = field(default_factory=dict)  # links to other steps

    @property
    def duration_ns(self) -> int:
        return self.end_ns - self.start_ns

    @property
    def edges(self) -> int:
        return sum(len(p) for p in self.preds)


def _slack(n: Node) -> int:
    return max(MIN_SLACK_NS, n.dur // 100)


class _Builder:
    """Indexes one step's spans and derives each leaf's gating predecessors."""

    def __init__(self, rows: Sequence[Mapping[str, Any]], root_id: str | None) -> None:
        self.rows = {r["span_id"]: r for r in rows}
        self.parent = {
            sid: r.get("parent_span_id") or None
            for sid, r in self.rows.items()
            if (r.get("parent_span_id") or None) in self.rows
        }
        kids: dict[str, list[str]] = defaultdict(list)
        for sid, p in self.parent.items():
            if p is not None and p != sid:
                kids[p].append(sid)
        self.kids = kids
        self.root_id = root_id if root_id in self.rows else None
        # A switch cuts through: its spans (the emulator's `forward`) last as long as the
        # transfers crossing it and gate nothing those transfers do not; as nodes they would
        # keep a faster link's transfers at their measured time.
        leaves = [
            sid
            for sid in self.rows
            if sid not in kids and sid != self.root_id and not _switch(self.rows[sid])
        ]
        leaves.sort(key=lambda s: (int(self.rows[s]["start_ns"]), int(self.rows[s]["end_ns"])))
        self.nodes = [self._node(self.rows[s]) for s in leaves]
        self.index = {n.span_id: i for i, n in enumerate(self.nodes)}
        self.by_end = sorted(range(len(self.nodes)), key=lambda i: self.nodes[i].end)
        self.ends = [self.nodes[i].end for i in self.by_end]
        self._last_leaf: dict[str, int] = {}

    @staticmethod
    def _node(r: Mapping[str, Any]) -> Node:
        return Node(
            name=str(r.get("name")),
            start=int(r["start_ns"]),
            end=max(int(r["end_ns"]), int(r["start_ns"])),
            chip=r.get("chip_id"),
            chip_type=r.get("chip_type"),
            link=r.get("link_id"),
            link_type=r.get("link_type"),
            src=r.get("link_src"),
            dst=r.get("link_dst"),
            nbytes=float(r.get("op_bytes") or 0.0),
            span_id=str(r["span_id"]),
        )

    def ancestors(self, sid: str) -> list[str]:
        out, seen = [], {sid}
        p = self.parent.get(sid)
        while p is not None and p not in seen:
            out.append(p)
            seen.add(p)
            p = self.parent.get(p)
        return out

    def last_leaf(self, sid: str) -> int | None:
        """The leaf under span `sid` (itself, if a leaf) that ended last."""
        if sid in self._last_leaf:
            return self._last_leaf[sid]
        best: int | None = self.index.get(sid)
        stack = list(self.kids.get(sid, ()))
        while stack:
            s = stack.pop()
            i = self.index.get(s)
            if i is not None and (best is None or self.nodes[i].end > self.nodes[best].end):
                best = i
            stack.extend(self.kids.get(s, ()))
        self._last_leaf[sid] = best  # type: ignore[assignment]
        return best

    def ending_near(self, t: int, slack: int) -> list[int]:
        lo = bisect.bisect_left(self.ends, t - slack)
        hi = bisect.bisect_right(self.ends, t)
        return self.by_end[lo:hi]


def _switch(r: Mapping[str, Any]) -> bool:
    return r.get("chip_type") == "switch" and not r.get("link_id")


def _resource(n: Node) -> tuple[str, ...] | None:
    if n.link:
        return ("link", n.link, n.src or "", n.dst or "")
    if n.chip:
        return ("chip", n.chip)
    return None


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


def _hops_key(b: _Builder, n: Node) -> tuple[Any, ...]:
    """What the hops of one transfer share: parent, name, bytes and times."""
    return (b.parent.get(n.span_id), n.name, n.nbytes, n.start, n.end)


class _Edges:
    """The gating predecessors of every leaf of a `_Builder`."""

    def __init__(self, b: _Builder) -> None:
        self.b = b
        nodes = b.nodes
        groups: dict[Any, list[int]] = defaultdict(list)
        dst: dict[str, list[int]] = defaultdict(list)
        self.srcs: dict[tuple[Any, ...], set[str]] = defaultdict(set)  # a transfer's hops
        for i, n in enumerate(nodes):
            if n.link and n.src:
                self.srcs[_hops_key(b, n)].add(n.src)
            key = _resource(n)
            if key is not None:
                groups[key].append(i)
            if n.link and n.dst:
                dst[n.dst].append(i)
        self.res = {k: _Latest(nodes, v) for k, v in groups.items()}
        # A collective round (transfers under one parent that start together) ends with
        # its last transfer: what reads its result waits for that one.
        rounds: dict[tuple[Any, int], list[int]] = defaultdict(list)
        for i, n in enumerate(nodes):
            if n.link:
                rounds[(b.parent.get(n.span_id), n.start)].append(i)
        self.round_last = {
            i: max(v, key=lambda k: nodes[k].end) for v in rounds.values() for i in v
        }
        self.into = {k: _Latest(nodes, v) for k, v in dst.items()}
        self.joins: dict[tuple[Any, ...], list[int]] = {}
        self.preds: list[dict[int, int]] = [{} for _ in nodes]
        self.after: list[set[int]] = [set() for _ in nodes]
        self.join_of: list[tuple[Any, ...] | None] = [None] * len(nodes)
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
        if gap <= _slack(s):
            self.preds[i][j] = gap
        elif order:
            self.after[i].add(j)

    def _derive(self, i: int) -> None:
        b, n = self.b, self.b.nodes[i]
        slack = _slack(n)
        key = _resource(n)
        if key is not None:  # a link is shared, not serial: its order binds nothing
            self._add(i, self.res[key].latest(b.nodes, i, n.start + slack), not n.link)
        for lid in link_span_ids(b.rows[n.span_id].get("links")):
            if lid in b.rows:
                self._add(i, b.last_leaf(lid))
        if n.chip and n.chip in self.into:  # the transfers that delivered its input
            for j in self.into[n.chip].within(n.start, slack):
                self._add(i, j)
            last = self.into[n.chip].latest(b.nodes, i, n.start + slack)
            if last is not None and n.start - b.nodes[self.round_last[last]].end <= slack:
                self._add(i, self.round_last[last])  # ... and the rest of its round
        for src in self.srcs.get(_hops_key(b, n), ()) if n.link else ():
            if ("chip", src) in self.res:  # the work that produced it (any hop's source)
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


def build(rows: Iterable[Mapping[str, Any]], root_id: str | None = None) -> StepGraph:
    """The dependency graph of one step.

    Args:
        rows: the step's spans as mappings (steps.Step.spans): span_id, parent_span_id,
            name, start_ns, end_ns, chip_id, chip_type, link_id, link_type, link_src,
            link_dst, op_bytes, links.
        root_id: the step's root span (default: the longest span without a parent).
    """
    rows = list(rows)
    if not rows:
        return StepGraph("", "", 0, 0)
    if root_id is None:
        ids = {r["span_id"] for r in rows}
        tops = [r for r in rows if (r.get("parent_span_id") or None) not in ids]
        root_id = max(tops, key=lambda r: int(r["end_ns"]) - int(r["start_ns"]))["span_id"]
    b = _Builder(rows, root_id)
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
    _transfers(nodes, b)
    order = sorted(range(len(nodes)), key=lambda i: (nodes[i].start, nodes[i].name != JOIN))
    new = {old: k for k, old in enumerate(order)}
    lo = int(root["start_ns"]) if root else min(n.start for n in nodes)
    hi = int(root["end_ns"]) if root else lo
    hi = max([hi, *(n.end for n in nodes)])
    return StepGraph(
        trace_id=str((root or rows[0]).get("trace_id") or ""),
        name=str((root or rows[0]).get("name") or ""),
        start_ns=lo,
        end_ns=hi,
        nodes=[nodes[i] for i in order],
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
                    if x not in b.rows
                ]
            )
        },
    )


def _rounds(b: _Builder, preds: list[dict[int, int]]) -> list[dict[int, int]]:
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


def _transfers(nodes: list[Node], b: _Builder) -> None:
    """Group the hops of each transfer (same parent, name, bytes and times) and count the
    transfers that share each hop's link direction at its midpoint."""
    groups: dict[tuple[Any, ...], int] = {}
    per_dir: dict[tuple[str, ...], list[Node]] = defaultdict(list)
    for n in nodes:
        if not n.link:
            continue
        n.group = groups.setdefault(_hops_key(b, n), len(groups))
        per_dir[("link", n.link, n.src or "", n.dst or "")].append(n)
    for lst in per_dir.values():
        starts = sorted(n.start for n in lst)
        ends = sorted(n.end for n in lst)
        for n in lst:
            mid = (n.start + n.end) // 2
            n.concurrency = max(
                bisect.bisect_right(starts, mid) - bisect.bisect_right(ends, mid), 1
            )


def iter_graphs(
    con: Any, steps: pa.Table, rows: Sequence[int] | None = None, batch: int = 4
) -> Iterator[StepGraph]:
    """The graphs of a workload's steps (rows of its `steps` table; default all), loading
    `batch` steps' spans at a time: memory holds a few steps, not the run."""
    picks = list(range(steps.num_rows)) if rows is None else list(rows)
    for k in range(0, len(picks), batch):
        for st in load_steps(con, steps, picks[k : k + batch]):
            yield build(st.spans, st.root_id)


def topology_of(tables: Any) -> Topology:
    """The run's topology (nominal figures), from the analysis tables."""
    topo: Topology = tables.topology
    return topo
