"""An overloaded serving queue: requests arrive faster than the devices serve them.

For a served workload (requests linking to the batches that ran them, serving.py), per
device: the rate requests reach it (those it served, over the span of all arrivals) and
the rate it serves them (per second of its busy time). A device busy longer than the
requests took to arrive was dealt them faster than it serves: with the latency growing
over the run (the last quarter of requests waits much longer than the first) its queue has
no steady state. The finding names both rates; its saving is replayed with the overloaded
devices twice as fast.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from typing import Any

from chiptrace.analysis.model import Finding
from chiptrace.analysis.rule_input import RuleInput, ms
from chiptrace.analysis.serving import back_ends

GROWTH = 1.5  # the last quarter's mean latency over the first's


def _batches(con: Any, ids: list[str]) -> dict[str, tuple[str, int]]:
    """Per batch span id: the chip its work ran on and its duration (ns)."""
    rows = con.execute(
        "WITH b AS (SELECT trace_id, span_id, start_ns, end_ns FROM spans_raw "
        "WHERE lower(hex(span_id)) IN (SELECT unnest($1::VARCHAR[]))) "
        "SELECT lower(hex(b.span_id)), any_value(CAST(s.chip_id AS VARCHAR)) "
        "FILTER (WHERE s.chip_type IN ('gpu', 'npu')), any_value(b.end_ns - b.start_ns) "
        "FROM b JOIN spans_raw s ON s.trace_id = b.trace_id GROUP BY 1",
        [ids],
    ).fetchall()
    return {sid: (chip, int(d)) for sid, chip, d in rows if chip}


def queue_overload(x: RuleInput) -> list[Finding]:
    """Arrivals above the service rate, latency growing over the run."""
    steps = x.tables.steps
    links = back_ends(steps) if x.con is not None else None
    if not links or len(links) < 8:
        return []
    starts = steps.column("start_ns").to_pylist()
    ends = steps.column("end_ns").to_pylist()
    order = sorted(links, key=lambda k: starts[k])
    lat = [ends[k] - starts[k] for k in order]
    q = max(len(lat) // 4, 1)
    first, last = statistics.fmean(lat[:q]), statistics.fmean(lat[-q:])
    span = starts[order[-1]] - starts[order[0]]
    if span <= 0 or first <= 0 or last < GROWTH * first:
        return []
    arrival = (len(order) - 1) / span * 1e9
    batches = _batches(x.con, sorted(set(links.values())))
    served: dict[str, int] = defaultdict(int)
    busy: dict[str, int] = defaultdict(int)
    for b, n in _count(links).items():
        if b in batches:
            chip, d = batches[b]
            served[chip] += n
            busy[chip] += d
    # A device falls behind when it was busy longer than the requests took to arrive: the
    # requests it was dealt came faster than it served them.
    over = sorted(c for c in served if busy[c] > span)
    if not over:
        return []
    to_them = sum(served[c] for c in over) / span * 1e9
    service = sum(served[c] / busy[c] * 1e9 for c in over)
    lead = max(over, key=lambda c: busy[c])
    f = x.finding(
        "queue-overload",
        lead,
        {
            "arrival_rate_per_s": round(to_them, 1),
            "service_rate_per_s": round(service, 1),
            "all_arrivals_per_s": round(arrival, 1),
            "latency_first_quarter_ms": ms(first),
            "latency_last_quarter_ms": ms(last),
            "overloaded_devices": len(over),
            "devices": len(served),
        },
        f"requests reach {', '.join(over)} at {to_them:,.0f}/s, they serve at most "
        f"{service:,.0f}/s: their queue grows without bound (mean latency {first / 1e6:,.1f} ms "
        f"in the first quarter of requests, {last / 1e6:,.1f} ms in the last); add capacity, "
        "send them less, or admit less",
        0.0,
    )
    return [_with_parts(f, tuple(over))]


def _count(links: dict[int, str]) -> dict[str, int]:
    out: dict[str, int] = defaultdict(int)
    for b in links.values():
        out[b] += 1
    return out


def _with_parts(f: Finding, parts: tuple[str, ...]) -> Finding:
    import dataclasses

    return dataclasses.replace(f, parts=parts)
