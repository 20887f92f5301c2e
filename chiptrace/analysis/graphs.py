"""Step graphs (stepgraph.py) from the store: per step, or the ranks of one step joined.

Out of core: a few steps' spans of work are loaded as rows at a time, and each step's
transfers are grouped by DuckDB into one node each (hops.load), so memory holds a few
steps' work and one step's hops as arrays, not the run.

The same step of every rank (an imported `ProfilerStep#10` of eight ranks: one trace id,
steps.step_groups) is one graph: each rank's step under a virtual root, and each
collective (an NCCL kernel, a host `gloo:`/`nccl:` call) joined across the ranks. A
collective's kernel starts on each rank when that rank arrives and ends when the last one
has: in the graph each rank's arrival is a zero-length node (with the kernel's own
predecessors), the kernels wait on one join of the arrivals, and keep only the time after
the last arrival. So a rank made slower or later delays every rank's step in the replay,
as it did in the trace, and one made faster stops holding them back.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from chiptrace.analysis import hops as hop_table
from chiptrace.analysis.metrics import HOST_COLLECTIVE
from chiptrace.analysis.stepgraph import JOIN, Node, StepGraph, build
from chiptrace.analysis.steps import Step, load_steps, step_groups

COLLECTIVES = (*HOST_COLLECTIVE, "ncclKernel", "ncclDevKernel", "rccl")
ARRIVE = "(arrive)"  # a rank's arrival at a collective
_VIRTUAL = "(ranks)"
# Spans of work (Python rows, ~50 us each to derive) past which the ranks of a step are
# replayed one by one instead of joined.
JOIN_MAX_SPANS = 400_000


def iter_graphs(
    con: Any, steps: pa.Table, rows: Sequence[int] | None = None, batch: int = 4
) -> Iterator[StepGraph]:
    """The graphs of a workload's steps (rows of its `steps` table; default all), in run
    order, `batch` steps' spans at a time. Rows that are the same step of several ranks
    are one graph (its `members`: one per row, in `rows` order)."""
    picks = list(range(steps.num_rows)) if rows is None else list(rows)
    chosen = set(picks)
    units: list[list[int]] = []
    for group in step_groups(steps):
        mine = [i for i in group if i in chosen]
        if len(mine) > 1:
            units.append(mine)
        else:
            units.extend([i] for i in mine)
    first = {i: k for k, i in enumerate(picks)}
    units.sort(key=lambda u: min(first[i] for i in u))
    shared = Counter(steps.column("trace_id").to_pylist())
    starts, ends = steps.column("start_ns").to_pylist(), steps.column("end_ns").to_pylist()
    best = link_best(con, min(starts, default=0), max(ends, default=0)) if picks else {}
    k = 0
    while k < len(units):
        chunk = [units[k]]
        while k + len(chunk) < len(units) and sum(map(len, chunk)) < batch:
            chunk.append(units[k + len(chunk)])
        k += len(chunk)
        flat = [i for u in chunk for i in u]
        loaded = dict(zip(flat, load_steps(con, steps, flat, transfers=False), strict=True))
        lo, hi = min(starts[i] for i in flat), max(ends[i] for i in flat)
        for u in chunk:
            sts = [loaded[i] for i in u]
            if sum(len(st.spans) for st in sts) > JOIN_MAX_SPANS:  # too big to join: per rank
                for st in sts:
                    g = _graph(con, [st], lo, hi, True)
                    g.cache["link_best"] = best
                    yield g
                continue
            g = _graph(con, sts, lo, hi, shared[sts[0].trace_id] > 1)
            g.cache["link_best"] = best
            yield g


def link_best(con: Any, lo: int, hi: int) -> dict[str, float]:
    """Per link, the fastest any one transfer crossed it (bytes/s) in [lo, hi]: at least
    what the link can deliver, read once for all the steps replayed."""
    rows = con.sql(
        "SELECT CAST(link_id AS VARCHAR), max(op_bytes * 1e9 / (end_ns - start_ns)) "
        f"FROM spans_raw WHERE link_id IS NOT NULL AND op_bytes > 0 AND end_ns > start_ns "
        f"AND start_ns >= {int(lo)} AND start_ns <= {int(hi)} GROUP BY 1"
    ).fetchall()
    return {str(k): float(v) for k, v in rows if v}


def _graph(con: Any, sts: list[Step], lo: int, hi: int, shared: bool) -> StepGraph:
    """One step's graph, or (several Steps: its ranks) the ranks' joined graph."""
    groups, hops, alias = hop_table.load(con, sts[0].trace_id, lo, hi)
    owner: dict[str, int] = {}
    for k, st in enumerate(sts):
        owner.update(dict.fromkeys((r["span_id"] for r in st.spans), k))
    if shared:  # a loop inside one span, or ranks in one trace: these steps' part only
        groups = [g for g in groups if (g["parent_span_id"] or "") in owner]
    if len(sts) == 1:
        return build([*sts[0].spans, *groups], sts[0].root_id, hops, alias)
    rows: list[dict[str, Any]] = []
    for st in sts:
        for r in st.spans:
            rows.append({**r, "parent_span_id": _VIRTUAL} if r["span_id"] == st.root_id else r)
    start, end = min(st.start_ns for st in sts), max(st.end_ns for st in sts)
    virtual = {"span_id": _VIRTUAL, "trace_id": sts[0].trace_id, "name": sts[0].name}
    rows.append({**virtual, "start_ns": start, "end_ns": end})
    g = build([*rows, *groups], _VIRTUAL, hops, alias, extra=join_collectives)
    for g_row in groups:
        owner[g_row["span_id"]] = owner.get(g_row["parent_span_id"] or "", -1)
    of = np.array([owner.get(n.span_id, -1) if n.span_id else -1 for n in g.nodes])
    g.members = [(st.start_ns, st.end_ns, np.nonzero(of == k)[0]) for k, st in enumerate(sts)]
    return g


def join_collectives(nodes: list[Node], preds: list[dict[int, int]], after: list[set[int]]) -> None:
    """Join each collective across the chips that ran it (the k-th kernel of one name on
    each chip): arrivals, one join, and each kernel from the last arrival on. Only where
    every kernel of it ended after the last one started (they did wait for each other)."""
    per_chip: dict[tuple[str, str], list[int]] = defaultdict(list)
    for i, n in enumerate(nodes):
        if n.chip and not n.link and n.name.startswith(COLLECTIVES):
            per_chip[(n.chip, n.name)].append(i)
    rounds: dict[tuple[str, int], list[int]] = defaultdict(list)
    for (_, name), idx in per_chip.items():
        for k, i in enumerate(sorted(idx, key=lambda i: nodes[i].start)):
            rounds[(name, k)].append(i)
    for members in rounds.values():
        if len(members) < 2:
            continue
        t = max(nodes[i].start for i in members)
        if any(nodes[i].end < t for i in members):
            continue
        j = len(nodes)
        nodes.append(Node(JOIN, t, t))
        preds.append({})
        after.append(set())
        for i in members:
            n = nodes[i]
            preds[j][len(nodes)] = 0
            nodes.append(Node(ARRIVE, n.start, n.start, chip=n.chip, chip_type=n.chip_type))
            preds.append(preds[i])
            after.append(after[i])
            n.start = t
            preds[i], after[i] = {j: 0}, set()
