"""Critical path of one step (trace): the chain of spans that sets its end-to-end time.

Only the work that actually ran (leaf spans) can sit on the path; containers give the
structure. The walk starts at the last leaf to finish and steps backwards, each time to the
span that gated the current one's start:

- explicit dependencies first: OTel links (a span links to the transfers it waited on; with
  several, the last to finish gated it: fan-in) and the previous work on the same chip or
  link direction;
- otherwise program order: the latest-finishing earlier sibling of the span or of one of its
  ancestors (what a sequential host loop or an awaited fan-out looks like).

If an explicit dependency ends right before the span starts it wins; else the latest of all
candidates does. Time between a predecessor's end and the next span's start is a ``gap``
segment (untraced work, launch latency), so segment times always add up to the step time.

Device work launched from the host (a span with a `launch` link: an imported PyTorch
profiler kernel, copy or memset) follows device time:

- the step lasts until the last device work it launched ends, even after its host span
  ended (a GPU running behind a CPU that queued the whole step); every share is of that;
- such work is reached from its launch (the link) or from the work before it on its chip,
  never through host program order: a CPU call is not gated by a kernel it did not wait for;
- a host call that waits for the device (`cudaDeviceSynchronize`, `cudaStreamSynchronize`,
  a blocking `cudaMemcpy`, MTIA's `synchronize`) hands the path to the device work of its
  host that ended during it (via ``sync``): the wait is the GPU's time, not the CPU's.

Cost: O(n log n) in the step's spans; run it on a bounded span set (one step), not a store.
"""

from __future__ import annotations

import bisect
import json
import re
from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

from chiptrace.analysis.findings import CriticalPath, PathSegment

_MIN_SLACK_NS = 2_000
# Host calls that block until the device is done (CUDA, HIP, MTIA runtime names).
_SYNC = re.compile(r"(?i)synchroni[sz]e|^(cuda|hip)Memcpy(2D|3D)?(WithStream)?$")
_DEVICE_TYPES = ("gpu", "npu")


class _Span:
    __slots__ = (
        "id",
        "row",
        "start",
        "end",
        "parent",
        "children",
        "child_ends",
        "seq",
        "seq_ends",
        "last_leaf",
        "resource",
        "launched",
    )

    def __init__(self, row: Mapping[str, Any]) -> None:
        self.id: str = row["span_id"]
        self.row = row
        self.start: int = int(row["start_ns"])
        self.end: int = int(row["end_ns"])
        self.parent: _Span | None = None
        self.children: list[_Span] = []
        self.child_ends: list[int] = []  # children's ends, in order, for bisect
        self.seq: list[_Span] = []  # children in host program order (no launched device work)
        self.seq_ends: list[int] = []
        self.last_leaf: _Span = self
        self.launched = _is_launched(row.get("links"))
        if row.get("link_id"):
            self.resource: Any = ("link", row["link_id"], row.get("link_src"), row.get("link_dst"))
        elif row.get("chip_id"):
            self.resource = ("chip", row["chip_id"])
        else:
            self.resource = None


def _is_launched(raw: Any) -> bool:
    """Has an OTel link of kind `launch` (device work pointing at its launching call)."""
    if not raw or "launch" not in str(raw):
        return False
    try:
        items = json.loads(raw) if isinstance(raw, str) else raw
        return any(
            isinstance(i, dict) and (i.get("attributes") or {}).get("kind") == "launch"
            for i in items
        )
    except (ValueError, TypeError, AttributeError):
        return False


def _host(chip: str) -> str:
    return chip.rsplit("/", 1)[0] if "/" in chip else ""


def link_span_ids(raw: Any) -> list[str]:
    """The span ids a row's `links` column (JSON, or already decoded) points to."""
    if not raw:
        return []
    try:
        items = json.loads(raw) if isinstance(raw, str) else raw
        return [str(i["span_id"]).lower() for i in items if isinstance(i, dict) and "span_id" in i]
    except (ValueError, TypeError):
        return []


class _Graph:
    """The step's spans indexed for the backward walk."""

    def __init__(self, rows: Iterable[Mapping[str, Any]], root_id: str | None) -> None:
        self.spans = {r["span_id"]: _Span(r) for r in rows}
        for s in self.spans.values():
            p = self.spans.get(s.row.get("parent_span_id") or "")
            if p is not None and p is not s:
                s.parent = p
                p.children.append(s)
        self.root = self._pick_root(root_id)
        self.by_resource: dict[Any, list[_Span]] = defaultdict(list)
        self.device: dict[str, list[_Span]] = defaultdict(list)  # device leaves per host
        self.end = self.root.end  # ... or the end of the last device work the step launched
        self.covering: list[_Span] = []  # untagged leaves from the step's start (markers?)
        self._index(self.root)
        for lst in (*self.by_resource.values(), *self.device.values()):
            lst.sort(key=lambda x: x.end)
        self.res_ends = {k: [x.end for x in v] for k, v in self.by_resource.items()}
        self.dev_ends = {k: [x.end for x in v] for k, v in self.device.items()}

    def _pick_root(self, root_id: str | None) -> _Span:
        if root_id is not None and root_id in self.spans:
            return self.spans[root_id]
        roots = [s for s in self.spans.values() if s.parent is None]
        top = max(roots, key=lambda s: (s.end - s.start, -s.start))
        if root_id is not None or all(r.start >= top.start and r.end <= top.end for r in roots):
            return top
        # Parentless spans that reach outside the longest one (a trace of loose spans, or a
        # trace whose root was not collected): the trace as a whole is the step, under a
        # virtual root that spans them all.
        row = {
            "span_id": "",
            "name": "(trace)",
            "trace_id": top.row.get("trace_id"),
            "start_ns": min(r.start for r in roots),
            "end_ns": max(r.end for r in roots),
        }
        virtual = _Span(row)
        for r in roots:
            r.parent = virtual
            virtual.children.append(r)
        return virtual

    def _index(self, root: _Span) -> None:
        # Iterative post-order: deep traces must not hit the recursion limit.
        order, stack = [], [root]
        while stack:
            s = stack.pop()
            order.append(s)
            s.children.sort(key=lambda c: c.end)
            s.child_ends = [c.end for c in s.children]
            stack.extend(s.children)
        for s in reversed(order):
            if s.children:
                s.last_leaf = max((c.last_leaf for c in s.children), key=lambda x: x.end)
                s.seq = [c for c in s.children if not c.last_leaf.launched]
                s.seq_ends = [c.end for c in s.seq]
            elif s is not root and s.resource is None and s.start <= root.start:
                self.covering.append(s)
            elif s is not root and s.resource is not None:
                self.by_resource[s.resource].append(s)
                if s.launched and s.row.get("op_kind") != "sync":
                    self.device[_host(s.resource[1])].append(s)
            if s.launched:
                self.end = max(self.end, s.end)

    def explicit(self, s: _Span, bound: int) -> tuple[_Span | None, str]:
        best: _Span | None = None
        via = ""
        for lid in link_span_ids(s.row.get("links")):
            dep = self.spans.get(lid)
            if dep is None:
                continue
            leaf = dep.last_leaf
            if leaf.end <= bound and leaf.start < s.start and (best is None or leaf.end > best.end):
                best, via = leaf, "link"
        if s.resource in self.res_ends:  # not when s is the root itself (a one-span step)
            lst, ends = self.by_resource[s.resource], self.res_ends[s.resource]
            i = bisect.bisect_right(ends, bound) - 1
            while i >= 0 and (lst[i] is s or lst[i].start >= s.start):
                i -= 1
            if i >= 0 and (best is None or lst[i].end > best.end):
                best, via = lst[i], "resource"
        return best, via

    def sequential(self, s: _Span, bound: int) -> _Span | None:
        best: _Span | None = None
        node = s
        while node is not self.root and node.parent is not None:
            sibs = node.parent.seq
            i = bisect.bisect_right(node.parent.seq_ends, bound) - 1
            while i >= 0 and (sibs[i] is node or sibs[i].last_leaf.start >= s.start):
                i -= 1
            if i >= 0:
                cand = sibs[i].last_leaf
                if best is None or cand.end > best.end:
                    best = cand
            node = node.parent
        return best

    def _device_before(self, s: _Span, bound: int) -> _Span | None:
        """The launched device work of host span `s`'s host that ended last by `bound`."""
        chip = s.row.get("chip_id")
        if not chip or s.launched or s.row.get("chip_type") in _DEVICE_TYPES:
            return None
        host = _host(str(chip))
        if host not in self.dev_ends:
            return None
        i = bisect.bisect_right(self.dev_ends[host], bound) - 1
        return self.device[host][i] if i >= 0 else None

    def waited_for(self, s: _Span, top: int) -> _Span | None:
        """The device work that ended last while `s`, a blocking host call, waited (before
        `top`, where the path reached it)."""
        if not _SYNC.search(str(s.row.get("name") or "")):
            return None
        dev = self._device_before(s, top)
        return dev if dev is not None and dev.end > s.start else None

    def predecessor(self, s: _Span) -> tuple[_Span | None, str]:
        slack = max(_MIN_SLACK_NS, (s.end - s.start) // 100)
        exp, via = self.explicit(s, s.start + slack)
        if exp is not None and s.start - exp.end <= slack:
            return exp, via
        if s.launched:  # device work waits on its launch or its chip, not on host order
            return exp, via
        seq = self.sequential(s, s.start + slack)
        best, how = (
            (exp, via)
            if seq is None or (exp is not None and exp.end >= seq.end)
            else (
                seq,
                "sequence",
            )
        )
        # A host span that starts when device work ends, later than any host work it could
        # follow, resumed after the device: the host waited (untraced, or a deep queue).
        dev = self._device_before(s, s.start + slack)
        if dev is not None and dev.start < s.start and (best is None or dev.end > best.end):
            return dev, "device"
        return best, how


def _segment(s: _Span, on_path: int, via: str) -> PathSegment:
    r = s.row
    return PathSegment(
        name=str(r.get("name")),
        start_ns=s.start,
        end_ns=s.end,
        on_path_ns=max(on_path, 0),
        via=via,
        span_id=s.id,
        chip_id=r.get("chip_id"),
        chip_type=r.get("chip_type"),
        link_id=r.get("link_id"),
        link_type=r.get("link_type"),
        op_kind=r.get("op_kind"),
    )


GAP = "(gap)"  # the name of untraced stretches of a path


def _gap(start: int, end: int) -> PathSegment:
    return PathSegment(name=GAP, start_ns=start, end_ns=end, on_path_ns=end - start, via="gap")


def critical_path(rows: Iterable[Mapping[str, Any]], root_id: str | None = None) -> CriticalPath:
    """The critical path of one step.

    Args:
        rows: the step's spans as mappings with span_id, parent_span_id (hex text), name,
            start_ns, end_ns, chip_id, chip_type, link_id, link_type, link_src, link_dst,
            op_kind and links (the OTel links JSON); other keys are ignored.
        root_id: the step's root span; default: the longest span without a parent here.

    Returns:
        A CriticalPath whose segments (spans and gaps, in time order) sum to the step's
        duration: the root's, or longer when device work it launched ends after it. An empty
        input gives an empty path.
    """
    rows = list(rows)
    if not rows:
        return CriticalPath(trace_id="", root="", start_ns=0, end_ns=0)
    g = _Graph(rows, root_id)
    root = g.root
    trace_id = str(root.row.get("trace_id") or "")
    root_name = str(root.row.get("name"))
    segs: list[PathSegment] = []
    cur: _Span | None = _last_work(g)
    t = g.end
    via = "end"
    seen: set[str] = set()
    while cur is not None and cur.id not in seen and cur.end > root.start:
        seen.add(cur.id)
        top = min(cur.end, t)
        if t > top:
            segs.append(_gap(top, t))
        dev = g.waited_for(cur, top)
        if dev is not None and dev.id not in seen:
            # The host call blocked on the device: its tail is the call, the rest the device's.
            low = max(dev.end, root.start)
            segs.append(_segment(cur, top - low, via))
            t, cur, via = low, dev, "sync"
            continue
        low = min(max(cur.start, root.start), top)
        segs.append(_segment(cur, top - low, via))
        t = low
        cur, via = g.predecessor(cur)
    if t > root.start:
        segs.append(_gap(root.start, t))
    segs.reverse()
    return CriticalPath(trace_id, root_name, root.start, g.end, tuple(segs), root.end)


def _last_work(g: _Graph) -> _Span:
    """Where the walk starts: the leaf that ends last, device work the step launched
    included. An untagged leaf that spans the whole step (Kineto's `PyTorch Profiler (0)`
    session marker, adopted by the step it starts with) is not work: the latest leaf on a
    chip or link goes first."""
    ends = [lst[-1] for lst in (*g.by_resource.values(), *g.device.values()) if lst]
    last = max([g.root.last_leaf, *ends], key=lambda x: x.end)
    if last in g.covering and last.end >= g.root.end and ends:
        return max(ends, key=lambda x: x.end)
    return last
