"""The nodes of a step graph (stepgraph.py) and the index of one step's spans they come
from: which spans are leaves (the work that ran), a transfer's hops as one node
(hops.py), a switch's or NIC's record of the transfers through it left out.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from chiptrace.analysis import hops as hop_table
from chiptrace.analysis.hops import Hops

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
        hops: the link hops of the transfer nodes (hops.Hops, owners are node indices).
        alias: span ids of hops merged into another's node -> that node (for `external`).
        members: the ranks' steps of a joined graph (graphs.py): each one's start, end
            and nodes; empty for a graph of one step.
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
    hops: Hops = field(default_factory=Hops.empty)
    alias: dict[str, int] = field(default_factory=dict)
    cache: dict[Any, Any] = field(default_factory=dict)  # what a replay derives once a graph
    members: list[tuple[int, int, np.ndarray]] = field(default_factory=list)

    @property
    def duration_ns(self) -> int:
        return self.end_ns - self.start_ns

    @property
    def edges(self) -> int:
        return sum(len(p) for p in self.preds)


# A hook of `build`: given the nodes, each one's gating predecessors (index -> gap) and the
# work it follows, it may add nodes and change edges (every index stays valid).
Extra = Callable[[list[Node], list[dict[int, int]], list[set[int]]], None]


def slack_of(n: Node) -> int:
    """How close before a node's start a predecessor must end to have gated it."""
    return max(MIN_SLACK_NS, n.dur // 100)


class Builder:
    """Indexes one step's spans and derives each leaf's gating predecessors. `hops`: the
    step's transfers already grouped (rows hold one representative each, `alias` maps
    the other hops' ids to it); None: group the rows' leaf link spans here."""

    def __init__(
        self,
        rows: Sequence[Mapping[str, Any]],
        root_id: str | None,
        hops: Hops | None = None,
        alias: dict[str, str] | None = None,
    ) -> None:
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
        leaves = [sid for sid in self.rows if sid not in kids and sid != self.root_id]
        if hops is None:
            drop, hops, alias = hop_table.from_rows(
                list(self.rows.values()), self.parent, set(leaves)
            )
            gone = set(drop)
            leaves = [sid for sid in leaves if sid not in gone]
            for sid in gone:
                del self.rows[sid]
        self.alias = alias or {}
        ends = {x for d in hops.dirs for x in d[1:] if x}
        leaves = [sid for sid in leaves if not _mirror(self.rows[sid], ends)]
        leaves.sort(key=lambda s: (int(self.rows[s]["start_ns"]), int(self.rows[s]["end_ns"])))
        self.nodes = [self._node(self.rows[s]) for s in leaves]
        self.index = {n.span_id: i for i, n in enumerate(self.nodes)}
        hops.renumber([self.index.get(r, -1) for r in hops.reps])
        self.hops = hops
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


PASS_THROUGH = ("switch", "nic")  # chips that forward transfers rather than compute


def _mirror(r: Mapping[str, Any], ends: set[str]) -> bool:
    """A switch's or NIC's comm/io span over transfers the step records hop by hop (the
    emulator's `forward`, `rx`): it lasts as long as they do, so it is their record, not
    work of its own; as a node it would keep their old time when a change speeds them."""
    return (
        r.get("chip_type") in PASS_THROUGH
        and r.get("op_kind") in ("comm", "io")
        and not r.get("link_id")
        and r.get("chip_id") in ends
    )
