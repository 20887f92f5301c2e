"""What-if replay of a served workload: requests whose work runs in batches they link to.

A request (`request`, a step) waits in a queue, then for the batch that serves it (a trace
of its own, on some device, linked from the request). Its latency depends on every batch
before it on that device, so the graph here is the back end's timeline: the batches'
spans in one graph (stepgraph.build under a virtual root), a window of batches at a time.
A batch starts when its device frees (the previous batch's last work: the graph's program
order joins them) or when the batcher closed it, never before its last request arrived
(a floor). A change moves each batch's end; each request's latency moves with its batch.
`evaluate` dispatches: served workloads here, others per step (whatif.evaluate).
"""

from __future__ import annotations

import json
import statistics
from collections import defaultdict
from collections.abc import Mapping
from typing import Any

import pyarrow as pa

from chiptrace.analysis import whatif
from chiptrace.analysis.batcher import Batcher
from chiptrace.analysis.stepgraph import build
from chiptrace.analysis.steps import load_steps
from chiptrace.topology import Topology

WINDOW = 256  # batches per graph: the queue's memory is shorter than this
_VIRTUAL = "(serving)"


def _first_link(raw: Any) -> str | None:
    if not raw:
        return None
    try:
        items = json.loads(raw) if isinstance(raw, str) else raw
    except ValueError:
        return None
    for i in items if isinstance(items, list) else []:
        if isinstance(i, dict) and i.get("span_id"):
            return str(i["span_id"]).lower()
    return None


def back_ends(steps: pa.Table) -> dict[int, str] | None:
    """Per step row the span it links to (its batch); None unless most steps link."""
    if "links" not in steps.column_names or not steps.num_rows:
        return None
    out = {}
    for k, raw in enumerate(steps.column("links").to_pylist()):
        sid = _first_link(raw)
        if sid:
            out[k] = sid
    return out if len(out) * 2 >= steps.num_rows else None


def _batches(con: Any, ids: list[str]) -> pa.Table:
    rel = con.execute(
        "SELECT lower(hex(trace_id)) AS trace_id, lower(hex(span_id)) AS span_id, "
        "CAST(name AS VARCHAR) AS name, start_ns, greatest(end_ns, start_ns) AS end_ns "
        "FROM spans_raw WHERE lower(hex(span_id)) IN (SELECT unnest($1::VARCHAR[])) "
        "ORDER BY start_ns",
        [ids],
    )
    names = ["trace_id", "span_id", "name", "start_ns", "end_ns"]
    return pa.Table.from_pylist([dict(zip(names, r, strict=True)) for r in rel.fetchall()])


def _shifts(
    con: Any,
    batches: pa.Table,
    arrival: dict[str, int],
    topo: Topology,
    changes: Mapping[str, whatif.Change],
) -> dict[str, dict[str, float]]:
    """Per change, per batch span id: how much earlier (negative) or later it ends."""
    out: dict[str, dict[str, float]] = {k: {} for k in changes}
    for lo in range(0, batches.num_rows, WINDOW):
        steps = load_steps(con, batches, list(range(lo, min(lo + WINDOW, batches.num_rows))))
        rows: list[dict[str, Any]] = []
        root_of: dict[str, str] = {}
        for st in steps:
            for s in st.spans:
                r = dict(s)
                if r["span_id"] == st.root_id:
                    r["parent_span_id"] = _VIRTUAL
                rows.append(r)
                root_of[r["span_id"]] = st.root_id
        start = min(st.start_ns for st in steps)
        end = max(st.end_ns for st in steps)
        rows.append({"span_id": _VIRTUAL, "name": _VIRTUAL, "start_ns": start, "end_ns": end})
        g = build(rows, _VIRTUAL)
        for i, n in enumerate(g.nodes):
            b = root_of.get(n.span_id)
            if b in arrival:
                g.floor[i] = arrival[b]
        last: dict[str, int] = defaultdict(int)
        for n in g.nodes:
            b = root_of.get(n.span_id)
            if b:
                last[b] = max(last[b], n.end)
        for k, c in changes.items():
            ends = whatif.replay_ends(g, c, topo)
            new: dict[str, float] = defaultdict(float)
            for i, n in enumerate(g.nodes):
                b = root_of.get(n.span_id)
                if b:
                    new[b] = max(new[b], ends[i])
            out[k].update({b: new[b] - last[b] for b in last})
    return out


def evaluate_served(
    con: Any, steps: pa.Table, links: dict[int, str], topo: Topology, changes: Mapping[str, Any]
) -> dict[str, dict[str, float]]:
    """Per change: requests, the measured and replayed mean latency, the saving (ns).

    Chip changes (speed, a straggler's delay) run the batcher again (batcher.py): the
    batches re-form around the changed devices. Link changes, and runs whose batcher the
    manifest does not record, replay the batches as they ran."""
    replayer = Batcher.load(con, steps, links, topo)
    starts = steps.column("start_ns").to_pylist()
    ends = steps.column("end_ns").to_pylist()
    lat = [ends[k] - starts[k] for k in links]
    m = statistics.fmean(lat) if lat else 0.0
    saved: dict[str, float] = {}
    rest = {}
    for name, c in changes.items():
        # A downed link's fix (`typical`) that brings back a device the pool left out.
        back = replayer.restorable(c.typical, topo) if replayer is not None else frozenset()
        if replayer is not None and not c.bandwidth and (back or not c.typical):
            saved[name] = replayer.saving(_speeds(replayer, c, topo), c.undelay, back)
        else:
            rest[name] = c
    if rest:
        batches = _batches(con, sorted(set(links.values())))
        arrival: dict[str, int] = {}
        for k, b in links.items():
            arrival[b] = max(arrival.get(b, starts[k]), starts[k])
        shifts = _shifts(con, batches, arrival, topo, rest)
        for name in rest:
            new = [ends[k] - starts[k] + shifts[name].get(b, 0.0) for k, b in links.items()]
            saved[name] = m - (statistics.fmean(new) if new else 0.0)
    return {
        name: {
            "steps": len(lat),
            "measured_ns": m,
            "replayed_ns": m - saved[name],
            "saving_ns": saved[name],
        }
        for name in changes
    }


def _speeds(b: Batcher, c: whatif.Change, topo: Topology) -> dict[str, float]:
    """Per serving device: how many times faster the change makes it (ids or types)."""
    out = {}
    for d in b.policy.devices:
        chip = topo.chips.get(d)
        k = whatif._matches(c.speed, d, chip.type if chip else d.split(":", 1)[0])
        if k:
            out[d] = float(k)
    return out


def evaluate(
    con: Any,
    steps: pa.Table,
    topo: Topology,
    changes: Mapping[str, whatif.Change],
    stages: Any = None,
) -> dict[str, dict[str, float]]:
    """Replay a workload under each change: served workloads (steps linking to batches)
    by their mean request latency over the run, others by their median step (`stages`:
    see whatif.evaluate)."""
    links = back_ends(steps)
    if links:
        return evaluate_served(con, steps, links, topo, changes)
    return whatif.evaluate(con, steps, topo, changes, stages)
