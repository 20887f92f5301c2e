"""An overloaded serving queue: requests arrive faster than the devices can serve them.

For a served workload (requests linking to the batches that ran them, serving.py): the
rate requests arrive over the run against the most the serving devices can serve, each
running batches that fill the token budget back to back (batcher.py prices them from the
run's own batches). Dealt in turn (`static`), each device gets an equal share and one
slower than its share falls behind; placed by earliest finish (`dynamic`), the pool serves
all arrivals together. Only arrivals above that service rate make a queue with no steady
state: a latency that grows while the first batches warm up, or batches that take long,
are not overload. A run whose batcher is not recorded counts the most requests a second
any of its batches served, a floor on what a device can serve, so there the latency must
also grow (the last quarter of requests waiting GROWTH times the first's). The finding
names both rates; its `parts` are the whole pool, which shares the batcher's queue; its
saving is replayed (ranking.py). Serving devices a downed link cut off are `link-down`.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections import defaultdict
from typing import Any

from chiptrace.analysis.batcher import Batcher
from chiptrace.analysis.findings import Finding
from chiptrace.analysis.rule_input import RuleInput, ms
from chiptrace.analysis.serving import back_ends

GROWTH = 1.5  # without the batcher's model: the last quarter's mean latency over the first's


def _observed(con: Any, links: dict[int, str]) -> dict[str, float]:
    """Per device: the most requests per second one of its batches served (a floor on
    what it can serve, for runs whose batcher is not recorded)."""
    count: dict[str, int] = defaultdict(int)
    for b in links.values():
        count[b] += 1
    rows = con.execute(
        "WITH b AS (SELECT trace_id, span_id, start_ns, end_ns FROM spans_raw "
        "WHERE lower(hex(span_id)) IN (SELECT unnest($1::VARCHAR[]))) "
        "SELECT lower(hex(b.span_id)), any_value(CAST(s.chip_id AS VARCHAR)) "
        "FILTER (WHERE s.chip_type IN ('gpu', 'npu')), any_value(b.end_ns - b.start_ns) "
        "FROM b JOIN spans_raw s ON s.trace_id = b.trace_id GROUP BY 1",
        [sorted(count)],
    ).fetchall()
    best: dict[str, float] = {}
    for sid, chip, d in rows:
        if chip and d and d > 0:
            best[chip] = max(best.get(chip, 0.0), count[sid] / d * 1e9)
    return best


def _rates(
    x: RuleInput, links: dict[int, str], b: Batcher | None
) -> tuple[float, dict[str, float], str]:
    """(arrivals per second, per device the most it serves, the schedule policy)."""
    if b is not None:
        return b.arrival_rate(), b.capacity(), b.policy.schedule
    starts = sorted(x.tables.steps.column("start_ns").to_pylist()[k] for k in links)
    span = starts[-1] - starts[0]
    arrival = (len(starts) - 1) / span * 1e9 if span > 0 else 0.0
    return arrival, _observed(x.con, links), "dynamic"


def queue_overload(x: RuleInput) -> list[Finding]:
    """Arrivals above the service rate of the devices that serve them."""
    steps = x.tables.steps
    links = back_ends(steps) if x.con is not None else None
    if not links or len(links) < 8:
        return []
    b = Batcher.load(x.con, steps, links, x.tables.topology)
    cut = _cut_off(x, b) if b is not None else []
    arrival, capacity, schedule = _rates(x, links, b)
    if not capacity or arrival <= 0:
        return cut
    if schedule == "static":  # an equal share each: every device slower than it falls behind
        share = arrival / len(capacity)
        over = [d for d, c in capacity.items() if c < share]
        to_them, service = share * len(over), sum(capacity[d] for d in over)
    else:
        over = list(capacity) if sum(capacity.values()) < arrival else []
        to_them, service = arrival, sum(capacity.values())
    if not over:
        return cut
    starts = steps.column("start_ns").to_pylist()
    ends = steps.column("end_ns").to_pylist()
    lat = [ends[k] - starts[k] for k in sorted(links, key=lambda k: starts[k])]
    q = max(len(lat) // 4, 1)
    first, last = statistics.fmean(lat[:q]), statistics.fmean(lat[-q:])
    if b is None and last < GROWTH * first:
        # What batches served is a floor on what the devices can serve, not the most:
        # without the batcher's model an overload must show as a queue that grows.
        return cut
    lead = min(over, key=lambda d: (capacity[d], d))
    f = x.finding(
        "queue-overload",
        lead,
        {
            "arrival_rate_per_s": round(to_them, 1),
            "service_rate_per_s": round(service, 1),
            "all_arrivals_per_s": round(arrival, 1),
            # dealt in turn, the pool keeps up with the slowest device's pace only
            "pool_service_rate_per_s": round(
                len(capacity) * min(capacity.values())
                if schedule == "static"
                else sum(capacity.values()),
                1,
            ),
            "schedule": schedule,
            "latency_first_quarter_ms": ms(first),
            "latency_last_quarter_ms": ms(last),
            "overloaded_devices": over,
            "devices": len(capacity),
            "cut_off_by": [g.culprit for g in cut],
        },
        f"requests reach {_names(over)} at {to_them:,.0f}/s, they serve at most "
        f"{service:,.0f}/s in full batches: their queue grows without bound (mean latency "
        f"{first / 1e6:,.1f} ms in the first quarter of requests, {last / 1e6:,.1f} ms in the "
        "last); add capacity, send them less, or admit less",
        0.0,
    )
    # The pool shares the batcher's queue: every device's speed moves it, and a device the
    # pool lost (cut) is capacity it lacks.
    lost = tuple(d for g in cut for d in g.parts[1:])
    pool = tuple(capacity) + lost  # in the pool's order
    return [dataclasses.replace(f, parts=pool), *cut]


def _cut_off(x: RuleInput, b: Batcher) -> list[Finding]:
    """Serving devices that served nothing while their peers served (the pool left them
    out): on each one's way from where requests come in, the link nearest that entry that
    carried nothing is down (everything past it carried nothing too). One `link-down` per
    link, the devices behind it in `parts`; its saving replayed with them back in the pool."""
    t = x.tables
    carried = {r["link_id"] for r in t.links.to_pylist() if r["bytes"]}
    kind = {c: spec.type for c, spec in t.topology.chips.items()}
    behind: dict[str, list[str]] = defaultdict(list)
    for d in b.cut_off:
        if not any(kind.get(p) == kind.get(d) for p in b.placeable):
            continue  # none of its kind served: not a device the pool lost
        empty = [lk for lk in b.paths.get(d, []) if lk not in carried]
        if empty:
            behind[empty[-1]].append(d)
    out = []
    for link, devices in behind.items():
        peers = [p for p in b.placeable if kind.get(p) in {kind.get(d) for d in devices}]
        f = x.finding(
            "link-down",
            link,
            {"carried_bytes": 0, "cut_off": devices, "peers_serving": len(peers), "served": 0},
            f"{_names(devices)} served no request while {len(peers)} peers served: {link}, on "
            f"their way from where requests come in, carried nothing: it is down and the pool "
            "serves without them; bring the link back (cable, lanes, link training)",
            0.0,
        )
        out.append(dataclasses.replace(f, parts=(link, *devices)))
    return out


def _names(devices: list[str]) -> str:
    return (
        ", ".join(devices) if len(devices) <= 4 else f"{len(devices)} devices ({devices[0]}, ...)"
    )
