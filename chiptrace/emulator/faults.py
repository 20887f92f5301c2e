"""Faults injected into a run: `KIND:TARGET[:VALUE]`, TARGET a chip or link id as in the spans.

- `slow:gpu:3:4`                     gpu:3 computes 4x slower
- `degrade:nvlink6:gpu:1-switch:0:0.1` that link runs at 10% of its bandwidth, both ways
- `down:nvlink6:gpu:1-switch:0`      that link is gone: traffic reroutes; a chip it was the
                                     only path to is lost (below)
- `straggler:gpu:5:0.5`              gpu:5 starts each step 0.5 ms late
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace

import numpy as np

from chiptrace.emulator.errors import FaultError
from chiptrace.emulator.network import Network
from chiptrace.emulator.topology_files import Topology

KINDS = ("slow", "degrade", "down", "straggler")
_NEEDS_VALUE = {
    "slow": "a factor > 0 (4 = four times slower)",
    "degrade": "a fraction in (0, 1]",
    "straggler": "a delay in ms >= 0",
}


@dataclass(frozen=True, slots=True)
class Fault:
    """One parsed fault."""

    spec: str
    kind: str
    target: str
    value: float | None = None

    def to_manifest(self) -> dict[str, object]:
        return {"spec": self.spec, "kind": self.kind, "target": self.target, "value": self.value}


def link_state(
    faults: list[Fault], lost: dict[str, list[str]] | None = None
) -> list[dict[str, object]]:
    """Each link not at its nominal state, as a fabric manager reports it (NVML's NVLink
    state and speed, ethtool's link speed): `down`, or `up` at a fraction of its bandwidth.
    A downed link that was the only path to chips names them (`chips_lost`: the host no
    longer sees them, as a GPU whose C2C or PCIe link fails falls off the bus).
    The analysis reads this telemetry, never the injected `faults` (that is the answer)."""
    out: list[dict[str, object]] = []
    for f in faults:
        if f.kind == "down":
            gone = (lost or {}).get(f.target)
            out.append(
                {"link": f.target, "state": "down", **({"chips_lost": gone} if gone else {})}
            )
        elif f.kind == "degrade":
            out.append({"link": f.target, "state": "up", "bandwidth_fraction": f.value})
    return out


def parse_fault(spec: str, topology: Topology) -> Fault:
    """Parse and check one `--fault` value against the topology.

    Raises:
        FaultError: malformed, unknown kind, bad value, or a target not in the topology.
    """
    kind, sep, rest = str(spec).partition(":")
    if kind not in KINDS or not sep or not rest:
        raise FaultError(
            f"--fault {spec!r}: expected KIND:TARGET[:VALUE] with KIND one of {', '.join(KINDS)}"
        )
    links = {lk.id for lk in topology.links}
    if kind != "down" and (rest in links or rest in topology.chips):
        raise FaultError(
            f"--fault {spec!r}: {kind} needs a VALUE after the target: {_NEEDS_VALUE[kind]}"
        )
    if kind == "down":
        target, value = rest, None
    else:
        target, _, raw = rest.rpartition(":")
        try:
            value = float(raw)
        except ValueError:
            raise FaultError(
                f"--fault {spec!r}: VALUE {raw!r} is not a number; expected {_NEEDS_VALUE[kind]}"
            ) from None
        ok = {"slow": value > 0, "degrade": 0 < value <= 1, "straggler": value >= 0}[kind]
        if not ok or not np.isfinite(value):
            raise FaultError(f"--fault {spec!r}: VALUE {raw!r}: expected {_NEEDS_VALUE[kind]}")
    known = links if kind in ("degrade", "down") else topology.chips
    if target not in known:
        what = "link" if kind in ("degrade", "down") else "chip"
        example = next(iter(known), "?")
        raise FaultError(
            f"--fault {spec!r}: no {what} {target!r} in topology {topology.name} (e.g. {example!r})"
        )
    return Fault(spec, kind, target, value)


@dataclass
class Effects:
    """What the faults do, per chip and per link (arrays indexed like the topology)."""

    topology: Topology
    bandwidth: list[float]
    slow: dict[str, float]
    delay_ns: dict[str, float]
    lost: dict[str, list[str]] = field(default_factory=dict)  # down link -> chips cut off


def apply_faults(topology: Topology, faults: Iterable[Fault]) -> Effects:
    """The faulted topology (down links removed, and the chips they cut off with their
    links) with degraded bandwidths and chip effects."""
    faults = list(faults)
    down = {f.target for f in faults if f.kind == "down"}
    lost = lost_chips(topology, [f.target for f in faults if f.kind == "down"])
    gone = {c for chips in lost.values() for c in chips}
    links = [
        lk
        for lk in topology.links
        if lk.id not in down and lk.src not in gone and lk.dst not in gone
    ]
    chips = {c: s for c, s in topology.chips.items() if c not in gone}
    topo = replace(topology, chips=chips, links=links) if down else topology
    # Valued kinds: parse_fault gives degrade, slow and straggler a value.
    valued = [(f.kind, f.target, f.value) for f in faults if f.value is not None]
    factor = {t: v for k, t, v in valued if k == "degrade"}
    bandwidth = [lk.bandwidth * factor.get(lk.id, 1.0) for lk in links]
    slow = {t: v for k, t, v in valued if k == "slow"}
    delay = {t: v * 1e6 for k, t, v in valued if k == "straggler"}
    return Effects(topo, bandwidth, slow, delay, lost)


def lost_chips(topology: Topology, down: list[str]) -> dict[str, list[str]]:
    """Chips the downed links cut off from their host: per downed link, the chips (not
    CPUs, not switches) that no longer reach, both ways, the CPU nearest them in the
    healthy rack. A GPU whose only C2C or PCIe link is down is gone from its host's
    view, so the workload runs without it. A topology without CPUs loses none (a missing
    route stays an error). A chip cut off only by several links together is listed under
    each of them."""
    cpus = topology.of_type("cpu")
    if not down or not cpus:
        return {}
    healthy = Network(topology)
    host = {
        c: near[0]
        for c, s in topology.chips.items()
        if s.type not in ("cpu", "switch") and (near := healthy.nearest(c, cpus))
    }

    def cut(links: set[str]) -> set[str]:
        net = Network(replace(topology, links=[lk for lk in topology.links if lk.id not in links]))
        return {c for c, h in host.items() if not (net.reaches(h, c) and net.reaches(c, h))}

    alone = {d: cut({d}) for d in down}
    together = cut(set(down)) - set().union(*alone.values())
    return {d: sorted(alone[d] | together, key=_chip_order) for d in down if alone[d] | together}


def _chip_order(chip_id: str) -> tuple[str, int]:
    t, _, i = chip_id.partition(":")
    return (t, int(i) if i.isdigit() else 0)
