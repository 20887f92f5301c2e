"""A bounded sample of steps, loaded span by span: input to the critical path and to the
rules that need exact interval arithmetic (overlap, starvation) rather than totals.

Which steps: the slowest, the median one, and a few spread over the run, at most
`max_steps` (their spans are loaded with one query; at 1,000 spans a step that is cheap).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from chiptrace.analysis.tables import type_of_chip, type_of_link

Interval = tuple[int, int]

_COLUMNS = (
    ("lower(hex(trace_id))", "trace_id"),
    ("lower(hex(span_id))", "span_id"),
    ("lower(hex(parent_span_id))", "parent_span_id"),
    ("CAST(name AS VARCHAR)", "name"),
    ("start_ns", "start_ns"),
    ("end_ns", "end_ns"),
    ("CAST(chip_id AS VARCHAR)", "chip_id"),
    ("CAST(chip_type AS VARCHAR)", "chip_type"),
    ("CAST(link_id AS VARCHAR)", "link_id"),
    ("CAST(link_type AS VARCHAR)", "link_type"),
    ("CAST(link_src AS VARCHAR)", "link_src"),
    ("CAST(link_dst AS VARCHAR)", "link_dst"),
    ("CAST(op_kind AS VARCHAR)", "op_kind"),
    ("op_bytes", "op_bytes"),
    ("op_flops", "op_flops"),
    ("links", "links"),
)


@dataclass(frozen=True, slots=True)
class Step:
    """One sampled step: its root and every span of its trace (dicts, ids as hex)."""

    trace_id: str
    root_id: str
    name: str
    start_ns: int
    end_ns: int
    spans: tuple[dict[str, Any], ...]

    @property
    def duration_ns(self) -> int:
        return self.end_ns - self.start_ns

    leaf_spans: tuple[dict[str, Any], ...] = ()

    def busy(self, spans: Iterable[dict[str, Any]]) -> list[Interval]:
        """The union of the spans' intervals within the step: a child that outlives or
        precedes its parent counts only inside it, so no share of the step exceeds 100%.
        (Clipping the few merged intervals, not every span, costs nothing extra.)"""
        out = []
        for a, b in union((s["start_ns"], s["end_ns"]) for s in spans):
            a, b = max(a, self.start_ns), min(b, self.end_ns)
            if b > a:
                out.append((a, b))
        return out

    def leaves(self) -> list[dict[str, Any]]:
        """Spans with no child in the step: the work that actually ran."""
        if self.leaf_spans:
            return list(self.leaf_spans)
        parents = {s["parent_span_id"] for s in self.spans if s["parent_span_id"]}
        return [s for s in self.spans if s["span_id"] not in parents]


def step_groups(steps: pa.Table) -> list[list[int]]:
    """Row indices of `steps` grouped into the run's steps: the same step of every rank or
    process (one trace id and name, the k-th such step of each process in that trace: the
    imported `ProfilerStep#10` of eight ranks is one group of eight); a step of one process
    alone is a group of one. Groups in order of their first start."""
    cols = steps.select(["trace_id", "name", "start_ns"]).to_pydict()
    procs = steps.column("proc").to_pylist() if "proc" in steps.column_names else None
    n = steps.num_rows
    order = sorted(range(n), key=lambda i: (cols["start_ns"][i], i))
    seen: Counter[tuple] = Counter()
    groups: dict[tuple, list[int]] = {}
    for i in order:
        key = (cols["trace_id"][i], cols["name"][i])
        k = seen[(*key, procs[i] if procs else None)]
        seen[(*key, procs[i] if procs else None)] += 1
        groups.setdefault((*key, k), []).append(i)
    return list(groups.values())


def pick_steps(steps: pa.Table, max_steps: int = 5) -> list[int]:
    """Row indices of `steps` to sample: the slowest step, the median one (of the slowest
    one's process where it has one), then the rest of their groups (`step_groups`: every
    rank's copy of the same step, so rules that compare ranks see them all) and of groups
    spread over the run, at most `max_steps` groups."""
    n = steps.num_rows
    if n == 0 or max_steps <= 0:
        return []
    dur = [
        max(e - s, 0)
        for s, e in zip(
            steps.column("start_ns").to_pylist(), steps.column("end_ns").to_pylist(), strict=True
        )
    ]
    groups = step_groups(steps)
    of = {i: g for g in groups for i in g}
    slowest = max(range(n), key=lambda i: (dur[i], i))
    procs = steps.column("proc").to_pylist() if "proc" in steps.column_names else [None] * n
    mine = [i for i in range(n) if procs[i] == procs[slowest]]
    pool = mine if len(mine) > 1 else list(range(n))
    by_dur = sorted(pool, key=lambda i: (dur[i], i))
    median = by_dur[len(by_dur) // 2]
    stride = max(len(groups) // max(max_steps - 2, 1), 1)
    chosen = [of[slowest], of[median], *groups[::stride]]
    picked: list[list[int]] = []
    for g in chosen:
        if g not in picked:
            picked.append(g)
    picked = picked[:max_steps]
    out = [slowest] + ([median] if median != slowest else [])
    out += [i for g in picked for i in g if i not in (slowest, median)]
    return out


def load_steps(
    con: Any, steps: pa.Table, rows: Sequence[int], transfers: bool = True
) -> list[Step]:
    """Load every span of the chosen steps' traces (one query; time bounds prune parts).

    A step that shares its trace with other steps of its workload (a loop inside one span)
    keeps only its root's descendants; chip and link types missing from a span are taken
    from its ids, as the store's writers do. `transfers=False`: all but the link spans
    (the step graph reads those grouped, graphs.iter_graphs)."""
    if not rows:
        return []
    sel = steps.take(pa.array(list(rows))).to_pylist()
    lo = min(r["start_ns"] for r in sel)
    hi = max(r["end_ns"] for r in sel)
    ids = ", ".join(f"unhex('{t}')" for t in sorted({r["trace_id"] for r in sel}))
    cols = ", ".join(f"{expr} AS {alias}" for expr, alias in _COLUMNS)
    result = con.sql(
        f"SELECT {cols} FROM spans_raw WHERE start_ns >= {int(lo)} AND start_ns <= {int(hi)} "
        f"AND trace_id IN ({ids}){'' if transfers else ' AND link_id IS NULL'}"
    ).fetchall()
    result += _late_device_work(con, result, cols, ids, hi)
    names = [alias for _, alias in _COLUMNS]
    by_trace: dict[str, list[dict[str, Any]]] = {}
    for row in result:
        d = dict(zip(names, row, strict=True))
        if d["chip_id"] is not None and d["chip_type"] is None:
            d["chip_type"] = type_of_chip(d["chip_id"], None)
        if d["link_id"] is not None and d["link_type"] is None:
            d["link_type"] = type_of_link(d["link_id"], None)
        by_trace.setdefault(d["trace_id"], []).append(d)
    shared = Counter(steps.column("trace_id").to_pylist())
    out = []
    for r in sel:
        spans = tuple(by_trace.get(r["trace_id"], ()))
        if shared[r["trace_id"]] > 1:
            spans = descendants(spans, r["span_id"])
        parents = {s["parent_span_id"] for s in spans if s["parent_span_id"]}
        leaves = tuple(s for s in spans if s["span_id"] not in parents)
        out.append(
            Step(
                r["trace_id"],
                r["span_id"],
                r["name"],
                int(r["start_ns"]),
                max(int(r["end_ns"]), int(r["start_ns"])),
                spans,
                leaves,
            )
        )
    return out


def whole_trace(con: Any, lo: int, hi: int) -> Step:
    """The whole analysed range as one step (root id ""; its top-level spans are the
    roots): for a trace of launched device work with no repeating span (an inference
    call, a benchmark), so the device rules still see it. One query; the caller keeps it
    to traces small enough to walk."""
    cols = ", ".join(f"{expr} AS {alias}" for expr, alias in _COLUMNS)
    rows = con.sql(
        f"SELECT {cols} FROM spans_raw WHERE end_ns >= {int(lo)} AND start_ns < {int(hi)}"
    ).fetchall()
    names = [alias for _, alias in _COLUMNS]
    spans = []
    for row in rows:
        d = dict(zip(names, row, strict=True))
        d["parent_span_id"] = d["parent_span_id"] or ""
        if d["chip_id"] is not None and d["chip_type"] is None:
            d["chip_type"] = type_of_chip(d["chip_id"], None)
        spans.append(d)
    # The extent of the work (on chips, links), not of a span around everything (the
    # profiler's own range), else of every span.
    work = [s for s in spans if s["chip_id"] or s["link_id"]] or spans
    start = min((s["start_ns"] for s in work), default=lo)
    end = max((s["end_ns"] for s in work), default=start)
    return Step("", "", "(whole trace)", int(start), int(max(end, start)), tuple(spans))


def _late_device_work(con: Any, rows: list[tuple], cols: str, ids: str, hi: int) -> list[tuple]:
    """Device work a step launched may start after its host span ends (a GPU behind a CPU
    that queued ahead): read it too, but only for traces with launch calls (others never
    pay for this second read)."""
    kind = [alias for _, alias in _COLUMNS].index("op_kind")
    if not any(r[kind] == "launch" for r in rows):
        return []
    return con.sql(
        f"SELECT {cols} FROM spans_raw WHERE start_ns > {int(hi)} AND trace_id IN ({ids}) "
        f"AND links IS NOT NULL AND chip_type IN ('gpu', 'npu')"
    ).fetchall()


def descendants(spans: Sequence[dict[str, Any]], root_id: str) -> tuple[dict[str, Any], ...]:
    """The span `root_id` and every span below it (iterative: traces may nest deeply)."""
    children: dict[str, list[dict[str, Any]]] = {}
    by_id = {}
    for s in spans:
        by_id[s["span_id"]] = s
        if s["parent_span_id"]:
            children.setdefault(s["parent_span_id"], []).append(s)
    if root_id not in by_id:
        return ()
    out, stack, seen = [], [by_id[root_id]], {root_id}
    while stack:
        s = stack.pop()
        out.append(s)
        for c in children.get(s["span_id"], ()):
            if c["span_id"] not in seen:
                seen.add(c["span_id"])
                stack.append(c)
    return tuple(out)


# ---------------------------------------------------------------- interval arithmetic


def union(intervals: Iterable[Interval]) -> list[Interval]:
    """Sorted, disjoint intervals covering the same time as `intervals`."""
    out: list[list[int]] = []
    for s, e in sorted(i for i in intervals if i[1] > i[0]):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return [(s, e) for s, e in out]


def length(intervals: Iterable[Interval]) -> int:
    """Total time covered by disjoint intervals."""
    return sum(e - s for s, e in intervals)


def intersect(a: Sequence[Interval], b: Sequence[Interval]) -> list[Interval]:
    """Intersection of two sorted, disjoint interval lists (a merge, linear time)."""
    out: list[Interval] = []
    i = j = 0
    while i < len(a) and j < len(b):
        s, e = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if e > s:
            out.append((s, e))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def subtract(a: Sequence[Interval], b: Sequence[Interval]) -> list[Interval]:
    """Parts of `a` not covered by `b` (both sorted and disjoint)."""
    out: list[Interval] = []
    j = 0
    for s, e in a:
        cur = s
        while j < len(b) and b[j][1] <= cur:
            j += 1
        k = j
        while k < len(b) and b[k][0] < e:
            if b[k][0] > cur:
                out.append((cur, b[k][0]))
            cur = max(cur, b[k][1])
            k += 1
        if cur < e:
            out.append((cur, e))
    return out
