"""`--speed`, `--link`, `--undelay` values of `chiptrace whatif` as a `Change`, checked
against the run's chips and links: an unknown name gets the nearest valid ones."""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Sequence

from chiptrace.analysis.errors import AnalysisError
from chiptrace.analysis.whatif import Change
from chiptrace.schema import CHIP_TYPES, LINK_TYPES
from chiptrace.topology import Topology


class WhatIfError(AnalysisError):
    """A what-if names a chip, link or type the run does not have, or a bad figure."""


def _known(name: str, valid: Iterable[str], what: str) -> str:
    valid = sorted(set(valid))
    if name in valid:
        return name
    near = difflib.get_close_matches(name, valid, n=3, cutoff=0.5) or valid[:3]
    raise WhatIfError(f"no {what} {name!r} in this run; nearest: {', '.join(near) or '(none)'}")


def _split(spec: str, flag: str) -> tuple[str, str]:
    name, sep, value = spec.rpartition("=")
    if not sep or not name or not value:
        raise WhatIfError(f"{flag} {spec!r}: expected NAME=VALUE, e.g. gpu:3=2 or pcie4=2x")
    return name, value


def _number(spec: str, raw: str, flag: str, what: str) -> float:
    try:
        v = float(raw)
    except ValueError:
        v = float("nan")
    if not v > 0 or v == float("inf"):
        raise WhatIfError(f"{flag} {spec!r}: {raw!r} is not {what}")
    return v


def parse_change(
    topo: Topology,
    chips: Iterable[str],
    links: Iterable[str],
    speed: Sequence[str] = (),
    link: Sequence[str] = (),
    undelay: Sequence[str] = (),
) -> Change:
    """A Change from CLI values.

    Args:
        topo: the run's topology (nominal link bandwidths).
        chips, links: chip and link ids that occur in the run.
        speed: `CHIP=K` or `TYPE=K`: that chip (every chip of that type) K times faster.
        link: `LINK=Kx` (K times its nominal bandwidth) or `LINK=GBPS` (GB/s per
            direction); LINK a link id or a link type.
        undelay: chips (or chip types) whose late starts against their peers go.

    Raises:
        WhatIfError: an unknown name (with the nearest valid ones) or a bad figure.
    """
    chip_names = set(chips) | set(topo.chips) | set(CHIP_TYPES)
    link_ids = set(links) | {lk.id for lk in topo.links}
    link_names = link_ids | set(LINK_TYPES)
    sp: dict[str, float] = {}
    for spec in speed:
        name, raw = _split(spec, "--speed")
        sp[_known(name, chip_names, "chip or chip type")] = _number(
            spec, raw, "--speed", "a factor > 0 (2 = twice as fast)"
        )
    bw: dict[str, float] = {}
    for spec in link:
        name, raw = _split(spec, "--link")
        name = _known(name, link_names, "link or link type")
        if raw.lower().endswith("x"):
            k = _number(spec, raw[:-1], "--link", "a factor > 0 (2x = twice its bandwidth)")
            members = [lk for lk in topo.links if name in (lk.id, lk.type)]
            if not members or not all(lk.bandwidth for lk in members):
                raise WhatIfError(
                    f"--link {spec!r}: the topology gives {name} no bandwidth; give GB/s instead"
                )
            for lk in members:
                bw[lk.id] = lk.bandwidth * k
        else:
            bw[name] = _number(spec, raw, "--link", "a bandwidth in GB/s > 0 (or 2x)") * 1e9
    slow = frozenset(_known(c, chip_names, "chip or chip type") for c in undelay)
    return Change(speed=sp, bandwidth=bw, undelay=slow)
