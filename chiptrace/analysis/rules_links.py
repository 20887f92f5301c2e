"""Rules about links: a slow link, a saturated link direction, a link that is down.

A transfer routed over several hops is one span per hop, each with the whole route's time,
so one slow link makes every hop of its routes look slow. Two things tell the slow link
from its neighbours: it is slow in every direction it carries data (a ring's neighbours
are slow one way only), and its slow transfers are not all explained by another slow link
that carries more of them (a host link behind the NIC is slow only where the NIC's is).
"""

from __future__ import annotations

import dataclasses
import statistics
from collections import defaultdict
from typing import Any

from chiptrace.analysis.findings import Finding, severity_for
from chiptrace.analysis.rule_input import RuleInput, ms
from chiptrace.analysis.rules_chips import peer_group
from chiptrace.analysis.savings import slowed_transfers_on_path
from chiptrace.analysis.serving import back_ends
from chiptrace.analysis.tables import COMPUTE_TYPES

SATURATED = 0.70  # busy and moving data at >= 70% of the link's bandwidth
BUSY = 0.30  # ... for at least 30% of the time
REPORTED_SLOW = 0.95  # a link state below this fraction of the bandwidth is a slow link
SLOW_LINK = 0.5  # achieved bandwidth under half that of links of the same type
SMALL_MESSAGE = 64 * 1024  # latency dominates below this: achieved bandwidth says little
MAX_TRANSFER_KEYS = 500_000  # spans read to tell a slow link from its neighbours
CARRIERS = ("nic", "switch")  # chip types that only move data


def _kind(chip: str | None) -> str:
    return (chip or "").rsplit("/", 1)[-1].split(":")[0]


def _slow_directions(links: list[dict[str, Any]]) -> dict[tuple, float]:
    """Per link direction, how much slower it is than directions of its type (1 = as fast):
    by bandwidth for bulk transfers; for small ones, where latency dominates bandwidth, by
    the median duration of transfers of the same name (ingress of a few KB)."""
    speed: dict[str, list[float]] = defaultdict(list)
    dur: dict[tuple[str, str], list[float]] = defaultdict(list)
    for r in links:
        if (r["median_bytes"] or 0) >= SMALL_MESSAGE:
            speed[r["link_type"]].append(r["bytes"] / r["busy_ns"])
        elif r["median_ns"]:
            dur[(r["link_type"], r["name"])].append(r["median_ns"])
    out = {}
    for r in links:
        key = (r["link_id"], r["link_src"], r["link_dst"])
        if (r["median_bytes"] or 0) >= SMALL_MESSAGE and len(speed[r["link_type"]]) >= 3:
            out[key] = statistics.median(speed[r["link_type"]]) / (r["bytes"] / r["busy_ns"])
        elif r["median_ns"] and len(dur[(r["link_type"], r["name"])]) >= 3:
            # Against the quicker quartile: routes of more hops take longer by latency alone.
            q = statistics.quantiles(dur[(r["link_type"], r["name"])], n=4, method="inclusive")
            out[key] = r["median_ns"] / max(q[0], 1.0)
    return out


def _slow_candidates(links: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Links slow in every direction that carries data, against same-type directions."""
    slow = _slow_directions(links)
    peers: dict[str, list[float]] = defaultdict(list)
    for r in links:
        peers[r["link_type"]].append(r["bytes"] / r["busy_ns"])
    phys: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in links:
        phys[r["link_id"]].append(r)
    out = {}
    for link_id, dirs in phys.items():
        got = [slow.get((d["link_id"], d["link_src"], d["link_dst"])) for d in dirs]
        factors = [f for f in got if f is not None]
        if len(factors) < len(got) or min(factors) * SLOW_LINK < 1:  # a direction not slow
            continue
        achieved = sum(d["bytes"] for d in dirs) / sum(d["busy_ns"] for d in dirs)
        out[link_id] = {
            "type": dirs[0]["link_type"],
            "achieved": achieved,
            "peer": statistics.median(peers[dirs[0]["link_type"]]),
            "slower": min(factors),
            "busy": sum(d["busy_ns"] for d in dirs),
            "transfers": sum(d["transfers"] for d in dirs),
        }
    return out


def _explained(x: RuleInput, cands: dict[str, dict[str, Any]]) -> set[str]:
    """Candidates whose every transfer also crosses another candidate with more transfers."""
    if len(cands) < 2 or x.con is None:
        return set()
    ids = ", ".join("'" + c.replace("'", "''") + "'" for c in cands)
    t = x.tables
    rows = x.con.sql(
        f"SELECT CAST(link_id AS VARCHAR), trace_id, parent_span_id, start_ns, end_ns "
        f"FROM spans_raw WHERE CAST(link_id AS VARCHAR) IN ({ids}) "
        f"AND end_ns >= {t.lo} AND start_ns < {t.hi} LIMIT {MAX_TRANSFER_KEYS}"
    ).fetchall()
    keys: dict[str, set[tuple]] = defaultdict(set)
    for link, *key in rows:
        keys[link].add(tuple(key))
    out = set()
    for a, ka in keys.items():
        for b, kb in keys.items():
            if a != b and len(kb) > len(ka) and ka <= kb:
                out.add(a)
    return out


def _saving(x: RuleInput, lost_ns: float) -> float:
    on_path = slowed_transfers_on_path(x)
    return on_path if on_path else lost_ns / x.n_steps


def slow_links(x: RuleInput) -> list[Finding]:
    """A link far slower than links of its type, in every direction it carries data
    (only a link whose bandwidth the topology gives)."""
    t = x.tables
    links = [r for r in x.link_rows() if r["busy_ns"] > 0 and r["bytes"]]
    cands = _slow_candidates(links)
    explained = _explained(x, cands)
    out = []
    for link_id, p in cands.items():
        nominal = t.topology.bandwidth(link_id)
        # Without its bandwidth a link is not judged: slower than its peers may be what it
        # carried (pageable copies, small messages), not the link.
        if link_id in explained or not nominal:
            continue
        lost = p["busy"] * (1 - 1 / p["slower"])
        f = x.finding(
            "link-bound",
            link_id,
            {
                "cause": "slow link",
                "link_type": p["type"],
                "achieved_GBps": round(p["achieved"], 3),
                "peer_median_GBps": round(p["peer"], 3),
                "times_slower": round(p["slower"], 2),
                "bandwidth_GBps": round(nominal / 1e9, 3) if nominal else None,
                "busy_share_both_directions": round(p["busy"] / t.wall_ns, 4),
                "transfers": p["transfers"],
                "lost_ms": ms(lost),
                "neighbours_explained": sorted(explained),
            },
            f"{link_id} is {p['slower']:.1f}x slower than other {p['type']} links, both ways: "
            f"check the link (degraded lanes, errors) or route around it",
            _saving(x, lost),
        )
        # Slower than its peers is a fault, whether or not a replay prices it (an nvl72
        # step is too big to replay: the rule's estimate stands, and so does its kind).
        out.append(_at_least_medium(dataclasses.replace(f, kind="fault")))
    return out


def _at_least_medium(f: Finding) -> Finding:
    # A degraded or missing link is a hardware fault: worth a look even where its traffic
    # cost little this run (rerouted, or hidden behind compute).
    if f.severity in ("low", "info"):
        return dataclasses.replace(f, severity="medium")
    return f


def saturated_links(x: RuleInput, skip: set[str]) -> list[Finding]:
    """A link direction near its known bandwidth much of the time while the chip it feeds
    waits (a link whose bandwidth the topology does not give is never judged saturated)."""
    t = x.tables
    util = {r["chip_id"]: r["busy_ns"] / t.wall_ns for r in t.chips.to_pylist()}
    out = []
    for r in x.link_rows():
        if r["busy_ns"] <= 0 or not r["bytes"] or r["link_id"] in skip:
            continue
        achieved = r["bytes"] / r["busy_ns"] * 1e9  # bytes/s while busy
        nominal = t.topology.bandwidth(r["link_id"])
        busy = r["busy_ns"] / t.wall_ns
        # Saturated means near the link's bandwidth: where that is unknown (no topology)
        # nothing says so; the report's links table gives the achieved rate instead.
        if busy < BUSY or not nominal or achieved < SATURATED * nominal:
            continue
        waiting = 1 - util.get(r["link_dst"] or "", 0.0)
        out.append(
            x.finding(
                "link-bound",
                r["link_id"],
                {
                    "cause": "saturated",
                    "link_type": r["link_type"],
                    "src": r["link_src"],
                    "dst": r["link_dst"],
                    "busy_share": round(busy, 4),
                    "achieved_GBps": round(achieved / 1e9, 3),
                    "bandwidth_GBps": round(nominal / 1e9, 3) if nominal else None,
                    "dst_idle_share": round(waiting, 4),
                    "transfers": r["transfers"],
                },
                f"{r['link_id']} is busy {busy:.0%} of the time at {achieved / 1e9:.0f} GB/s: "
                f"compress or shard the traffic, or use a faster link",
                busy * waiting * x.step_ns,
            )
        )
    return out


def _link_states(x: RuleInput, state: str) -> list[dict[str, Any]]:
    """The run's link-state telemetry (a fabric manager's, or the emulator's `link_state`):
    the entries in `state` ("up", "down"). The injected `faults` are never read: they are
    the answer, not a measurement."""
    return [
        s
        for m in x.tables.manifests
        for s in m.get("link_state") or []
        if isinstance(s, dict) and s.get("state") == state
    ]


def reported_fractions(x: RuleInput) -> dict[str, float]:
    """Links the link-state telemetry reports up at reduced bandwidth: id -> fraction of
    its bandwidth."""
    return {
        str(s.get("link")): float(s["bandwidth_fraction"])
        for s in _link_states(x, "up")
        if s.get("bandwidth_fraction")
    }


def reported_slow(x: RuleInput, skip: set[str]) -> list[Finding]:
    """A link that carried data while the link-state telemetry reports it up below its
    bandwidth (NVML's NVLink speed, ethtool's negotiated speed): slow whether or not it has
    peers to compare with (rack6 has two Ethernet links, one per NIC)."""
    state = reported_fractions(x)
    out = []
    for r in x.link_rows():
        link_id = r["link_id"]
        frac = state.get(link_id)
        nominal = x.tables.topology.bandwidth(link_id)
        if frac is None or frac >= REPORTED_SLOW or link_id in skip or not nominal:
            continue
        if r["busy_ns"] <= 0 or not r["bytes"]:
            continue
        lost = r["busy_ns"] * (1 - frac)
        f = x.finding(
            "link-bound",
            link_id,
            {
                "cause": "reported slow",
                "link_type": r["link_type"],
                "bandwidth_fraction": frac,
                "achieved_GBps": round(r["bytes"] / r["busy_ns"], 3),
                "bandwidth_GBps": round(nominal / 1e9, 3),
                "transfers": r["transfers"],
                "lost_ms": ms(lost),
            },
            f"{link_id} runs at {frac:.0%} of its bandwidth (its link state): check the link "
            "(degraded lanes, a renegotiated speed) or route around it",
            _saving(x, lost),
        )
        skip.add(link_id)
        out.append(_at_least_medium(dataclasses.replace(f, kind="fault")))
    return out


def link_bound(x: RuleInput) -> list[Finding]:
    """A link far slower than its peers, or one its link state reports slow, or a link
    direction near saturation while the chip it feeds waits."""
    out = slow_links(x)
    out += reported_slow(x, {f.culprit for f in out})
    return out + saturated_links(x, {f.culprit for f in out})


def _active(x: RuleInput) -> tuple[set[str], dict[str, set[tuple[str, str]]], set[str]]:
    """Chips with work or traffic; per chip the (link type, far end type) it used; used links."""
    t = x.tables
    used = {r["link_id"] for r in t.links.to_pylist() if r["transfers"]}
    active = {r["chip_id"] for r in t.chips.to_pylist()}
    for r in t.links.to_pylist():
        active |= {r["link_src"], r["link_dst"]} - {None}
    uses: dict[str, set[tuple[str, str]]] = defaultdict(set)
    for lk in t.topology.links:
        if lk.id in used and lk.src and lk.dst:
            uses[lk.src].add((lk.type or "", _kind(lk.dst)))
            uses[lk.dst].add((lk.type or "", _kind(lk.src)))
    return active, uses, used


def _ends(t: Any, link_id: str) -> tuple[str, ...]:
    lk = t.topology.link(link_id)
    return tuple(e for e in (lk.src, lk.dst) if e) if lk else ()


def link_down(x: RuleInput) -> list[Finding]:
    """A link of the topology that carried nothing, between two chips that worked, where
    chips of the same model used their link of that kind: it is down, and its traffic went
    another way. Needs a topology (the emulator records one)."""
    t = x.tables
    if not t.topology.links:
        return []
    active, uses, used = _active(x)
    mine = set(x.chips or ()) | {e for lk in x.links or () for e in _ends(t, lk)}
    out = chips_lost(x)
    for lk in t.topology.links:
        if lk.id in used or not (lk.src in active and lk.dst in active):
            continue
        for end, far in ((lk.src, lk.dst), (lk.dst, lk.src)):
            if x.chips is not None and end not in mine:
                continue
            want = (lk.type or "", _kind(far))
            group = peer_group(x, end, _kind(end))
            peers = [
                c
                for c in t.topology.chips
                if c != end and want in uses[c] and peer_group(x, c, _kind(c)) == group
            ]
            if peers:
                out.append(_down_finding(x, lk.id, end, peers))
                break
    mine_or_all = None if x.chips is None else mine
    # A GPU or NPU the link-state telemetry names lost is priced by chips_lost (its share of
    # the work); a lost host chip's cost is not in that telemetry, so _cut_off prices it.
    told = {
        str(c)
        for f in out
        for c in f.evidence.get("chips_lost") or ()
        if _kind(str(c)) in COMPUTE_TYPES
    }
    return out + _cut_off(x, active, uses, used, mine_or_all, told)


def _cut_off(
    x: RuleInput,
    active: set[str],
    uses: dict[str, set[tuple[str, str]]],
    used: set[str],
    mine: set[str] | None,
    told: frozenset[str] | set[str] = frozenset(),
) -> list[Finding]:
    """A chip that did nothing, none of whose links carried anything, while chips of its
    model worked over links like its own: its links are down (a DPU behind its one PCIe
    link), and its peers did its share. The fix prices as those peers sharing the work
    again: each (n + 1) / n times faster for n of them."""
    t = x.tables
    links_of: dict[str, list[Any]] = defaultdict(list)
    for lk in t.topology.links:
        for e in (lk.src, lk.dst):
            if e:
                links_of[e].append(lk)
    out = []
    working = {r["chip_id"] for r in t.chips.to_pylist() if r["ops"]}
    # A serving pool's lost device is queue-overload's to find and price: its batcher
    # replays the requests with the device back, where sharing its work misprices a queue.
    serving = x.con is not None and len(back_ends(t.steps) or ()) >= 8
    for chip, own in links_of.items():
        if chip in active or any(lk.id in used for lk in own) or _kind(chip) in CARRIERS:
            continue  # a NIC or switch left unused carries no work of its own to miss
        if chip in told or (serving and _kind(chip) in COMPUTE_TYPES):
            continue
        kind = _kind(chip)
        group = peer_group(x, chip, kind)
        wanted = {(lk.type or "", _kind(lk.dst if lk.src == chip else lk.src)) for lk in own}
        peers = sorted(
            c
            for c in t.topology.chips
            if c != chip
            and c in working
            and peer_group(x, c, _kind(c)) == group
            and wanted & uses[c]
        )
        if not peers or (mine is not None and not set(peers) & mine):
            continue  # no peer took its share, or none in this workload
        down = sorted(own, key=lambda lk: lk.id)[0]
        f = _down_finding(x, down.id, chip, peers)
        ev = {**f.evidence, "cut_off": chip, "links_down": sorted(lk.id for lk in own)}
        ev["took_over"] = peers
        out.append(
            dataclasses.replace(
                f,
                evidence=ev,
                suggestion=f"{chip} did no work and none of its links carried anything "
                f"({', '.join(ev['links_down'])}) while {len(peers)} peers of its model worked: "
                "its links are down and its peers did its share; check the link (cable, lanes, "
                "firmware) or its state in the fabric manager",
            )
        )
    return out


def chips_lost(x: RuleInput) -> list[Finding]:
    """A link the link-state telemetry reports down that was the only path to chips (the
    emulator's `link_state` `chips_lost`; a fabric manager's GPU that fell off the bus):
    the job ran without them. Saving: lost GPUs' or NPUs' share of their type's work, the
    step time the job would gain per step's worth of work with them back."""
    t, out = x.tables, []
    owned = {_kind(c) for c in x.chips} if x.chips is not None else None
    for s in _link_states(x, "down"):
        lost = [str(c) for c in s.get("chips_lost") or []]
        kinds = {_kind(c) for c in lost}
        devices = kinds & set(COMPUTE_TYPES)  # a workload's own; a NIC is every one's
        if not lost or (owned is not None and devices and not devices & owned):
            continue
        peers = sum(1 for c in t.topology.chips if _kind(c) in kinds)
        # A GPU or NPU lost takes its share of the step's work; a host chip (NIC, DPU)
        # takes none of it, and what its loss costs is not in the trace.
        share = sum(_kind(c) in devices for c in lost) / max(peers, len(lost))
        saving = x.step_ns * share if x.step_ns else 0.0
        link = str(s.get("link"))
        f = x.finding(
            "link-down",
            link,
            {
                "carried_bytes": 0,
                "chips_lost": lost,
                "of_chips": peers,
                "cost_ms_per_step": ms(saving) if devices else "unknown: a host chip",
            },
            f"{link} is down and was the only path to {', '.join(lost)}: the job ran "
            f"without {'it' if len(lost) == 1 else 'them'} ({len(lost)} of {peers}); "
            "check the link (cable, lanes, firmware) or its state in the fabric manager",
            saving,
            severity_for(saving / x.step_ns if x.step_ns else 0.0),
        )
        out.append(_at_least_medium(f))
    return out


def _down_finding(x: RuleInput, link_id: str, end: str, peers: list[str]) -> Finding:
    rows = [r for r in x.tables.links.to_pylist() if end in (r["link_src"], r["link_dst"])]
    rows.sort(key=lambda r: (-(r["bytes"] or 0), r["link_id"]))
    went = sorted({r["link_id"] for r in rows[:6]})
    saving = slowed_transfers_on_path(x) or 0.0
    f = x.finding(
        "link-down",
        link_id,
        {
            "carried_bytes": 0,
            "chip": end,
            "peers_using_theirs": len(peers),
            "traffic_went_over": went,
            "rerouted_bytes": sum(r["bytes"] or 0 for r in rows),
            "cost_ms_per_step": ms(saving),
        },
        f"{link_id} carried nothing while {len(peers)} peers of {end} used theirs; {end}'s "
        f"traffic went over {', '.join(went) or 'no other link'}: check the link (cable, "
        f"lanes, firmware) or its state in the fabric manager",
        saving,
        severity_for(saving / x.step_ns if x.step_ns else 0.0),
    )
    return _at_least_medium(f)


# Host memory the driver must stage through a pinned buffer: the PyTorch profiler names
# such copies "Memcpy HtoD (Pageable -> Device)" / "Memcpy DtoH (Device -> Pageable)".
_COPIES_SQL = """
SELECT CAST(link_id AS VARCHAR), CAST(link_src AS VARCHAR), CAST(link_dst AS VARCHAR),
       contains(CAST(name AS VARCHAR), 'Pageable') AS pageable, count(*),
       CAST(sum(op_bytes) AS DOUBLE), CAST(sum(end_ns - start_ns) AS DOUBLE)
FROM spans_raw
WHERE link_id IS NOT NULL AND CAST(name AS VARCHAR) LIKE 'Memcpy%' AND op_bytes >= {bulk}
  AND end_ns > start_ns AND end_ns >= {lo} AND start_ns < {hi}
GROUP BY ALL"""
MIN_PAGEABLE = 0.03  # pageable copy time, 3% of a step


def pageable_copies(x: RuleInput) -> list[Finding]:
    """Bulk host-device copies from pageable (unpinned) host memory. Their saving is what
    the same bytes take at the rate pinned copies reach on the same link direction in this
    trace; with none to compare, it is left unknown rather than guessed."""
    t = x.tables
    rows = x.link_rows()
    if x.con is None or not any(str(r["name"] or "").startswith("Memcpy") for r in rows):
        return []
    mine = {r["link_id"] for r in rows}
    got = x.con.sql(_COPIES_SQL.format(bulk=SMALL_MESSAGE, lo=t.lo, hi=t.hi)).fetchall()
    pinned = {(lk, a, b): (nb / ns) for lk, a, b, pg, _, nb, ns in got if not pg and ns and nb}
    out = []
    for lk, a, b, pg, n, nbytes, ns in got:
        if not pg or lk not in mine or not ns or ns / x.n_steps < MIN_PAGEABLE * x.step_ns:
            continue
        ref = pinned.get((lk, a, b))
        saving = max(ns - nbytes / ref, 0.0) / x.n_steps if ref else 0.0
        per_step = ns / x.n_steps
        out.append(
            x.finding(
                "pageable-copy",
                f"{lk} ({a}->{b})",
                {
                    "copies": n,
                    "bytes": nbytes,
                    "ms_per_step": ms(per_step),
                    "achieved_GBps": round(nbytes / ns, 3),
                    "pinned_GBps": round(ref, 3) if ref else None,
                    "saving": "at the pinned copies' rate" if ref else "unknown: no pinned copy",
                },
                f"{n} copies of {nbytes / 1e6:,.1f} MB from pageable host memory run at "
                f"{nbytes / ns:.2g} GB/s ({per_step / 1e6:.3g} ms a step): pin the host "
                f"buffers (DataLoader(pin_memory=True), tensor.pin_memory()) and copy with "
                f"non_blocking=True",
                saving,
                None if ref else ("medium" if per_step >= 0.10 * x.step_ns else "low"),
            )
        )
    return out
