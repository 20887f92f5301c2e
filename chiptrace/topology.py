"""The hardware model: chips and links with their nominal figures, and the one manifest reader.

The emulator builds a Topology from a TOML declaration (emulator/topology_files.py) and records it
in its run manifest (`Topology.to_manifest`); the report (analysis) and the dashboard (viewer)
read it back with `parse_topology`, so both see one manifest the same way. Decorated code
usually records no topology: then `known` is false and rules compare chips and links with
their peers instead.

Figures are in base units (FLOP/s, bytes, bytes/s, ns); 0 (or "" for a name) means "not
declared", so callers test truthiness rather than None. The reader is lenient about units
and key spellings (``bandwidth_Bps`` or ``bandwidth_GBps``, ``latency_ns`` or
``latency_us``) because manifests outlive code versions; the one key table below is the only
place a spelling is accepted.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

# figure -> {manifest key: multiplier to the base unit}. First key present (> 0) wins.
KEYS: dict[str, dict[str, float]] = {
    "bandwidth": {
        "bandwidth_Bps": 1.0,
        "bandwidth_bytes_per_s": 1.0,
        "bandwidth_GBps": 1e9,
        "bandwidth_gbps": 1e9 / 8,  # gigabits
        "bandwidth_bps": 1 / 8,
        "bandwidth": 1.0,
        "bw": 1.0,
    },
    "latency_ns": {"latency_ns": 1.0, "latency_us": 1e3, "latency_s": 1e9, "latency": 1e9},
    "memory_bandwidth": {
        "memory_bandwidth_Bps": 1.0,
        "mem_bw_Bps": 1.0,
        "memory_bandwidth_GBps": 1e9,
        "mem_bw_GBps": 1e9,
        "memory_bandwidth": 1.0,
        "mem_bw": 1.0,
        "hbm_bandwidth_Bps": 1.0,
    },
    "memory_bytes": {"memory_bytes": 1.0, "memory_GB": 1e9},
    "launch_overhead_ns": {"launch_overhead_ns": 1.0, "launch_overhead_us": 1e3},
    # a table {precision: figure}, or flat keys peak_flops_<precision> / peak_tflops_<precision>
    "peak_flops": {"peak_flops": 1.0, "peak": 1.0, "peak_tflops": 1e12, "flops": 1.0},
}
# Where an entry's id and type are (the first key present wins); the SQL views use these too.
ID_KEYS = {"chips": ("id", "chip_id"), "links": ("id", "link_id", "name")}
TYPE_KEYS = {"chips": ("type", "chip_type"), "links": ("type", "link_type")}


@dataclass(frozen=True, slots=True)
class ChipSpec:
    """One chip: peak FLOP/s per precision and memory figures; 0 or "" where not declared."""

    id: str
    type: str
    model: str = ""
    peak_flops: Mapping[str, float] = field(default_factory=dict)
    memory_bytes: float = 0.0
    memory_bandwidth: float = 0.0
    launch_overhead_ns: float = 0.0
    # {op class: {precision or "*": fraction of the roofline}} (emulator/efficiency.py)
    efficiency: Mapping[str, Mapping[str, float]] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class LinkSpec:
    """One full-duplex link from `src` to `dst`; `bandwidth` is per direction in bytes/s."""

    id: str
    type: str
    src: str = ""
    dst: str = ""
    bandwidth: float = 0.0
    latency_ns: float = 0.0


@dataclass
class Topology:
    """Chips by id and links in declaration order (routes index them), plus adjacency."""

    chips: dict[str, ChipSpec] = field(default_factory=dict)
    links: list[LinkSpec] = field(default_factory=list)
    name: str = ""
    source: str = ""
    description: str = ""
    adjacency: dict[str, list[tuple[str, int]]] = field(init=False, repr=False)
    _by_id: dict[str, int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.rebuild()

    def rebuild(self) -> None:
        """Recompute adjacency and the link index (after the link list changes)."""
        self.adjacency = {c: [] for c in self.chips}
        self._by_id = {}
        for i, lk in enumerate(self.links):
            self._by_id[lk.id] = i
            if lk.src and lk.dst:
                self.adjacency.setdefault(lk.src, []).append((lk.dst, i))
                self.adjacency.setdefault(lk.dst, []).append((lk.src, i))

    @property
    def known(self) -> bool:
        return bool(self.chips or self.links)

    def of_type(self, chip_type: str) -> list[str]:
        """Chip ids of one type, in declaration order."""
        return [c.id for c in self.chips.values() if c.type == chip_type]

    def link_index(self, link_id: str) -> int | None:
        return self._by_id.get(link_id)

    def link(self, link_id: str | None) -> LinkSpec | None:
        i = self._by_id.get(link_id or "")
        return None if i is None else self.links[i]

    def peak(self, chip_id: str, precision: str | None) -> float | None:
        """Peak FLOP/s of a chip at a precision (bf16 and fp16 stand in for each other)."""
        spec = self.chips.get(chip_id)
        if spec is None or not spec.peak_flops:
            return None
        p = precision or "fp32"
        alias = {"bf16": "fp16", "fp16": "bf16"}.get(p)
        return spec.peak_flops.get(p) or (spec.peak_flops.get(alias) if alias else None)

    def model(self, chip_id: str | None) -> str | None:
        """The chip's model (`B200`), where the topology names one."""
        spec = self.chips.get(chip_id or "")
        return spec.model or None if spec else None

    def bandwidth(self, link_id: str | None) -> float | None:
        spec = self.link(link_id)
        return spec.bandwidth or None if spec else None

    def to_manifest(self) -> dict[str, Any]:
        """The `topology` manifest key (docs/emulator.md): nominal figures, base units."""
        return {
            "name": self.name,
            "source": self.source,
            "chips": [
                {
                    "id": c.id,
                    "type": c.type,
                    "model": c.model,
                    "peak_flops": dict(c.peak_flops),
                    "memory_bytes": c.memory_bytes,
                    "memory_bandwidth_Bps": c.memory_bandwidth,
                    "launch_overhead_ns": c.launch_overhead_ns,
                    "efficiency": {k: dict(v) for k, v in c.efficiency.items()},
                }
                for c in self.chips.values()
            ],
            "links": [
                {
                    "id": lk.id,
                    "type": lk.type,
                    "src": lk.src,
                    "dst": lk.dst,
                    "bandwidth_Bps": lk.bandwidth,
                    "latency_ns": lk.latency_ns,
                    "full_duplex": True,
                }
                for lk in self.links
            ],
        }


# ---------------------------------------------------------------- reading manifests


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0


def _figure(d: Mapping[str, Any], figure: str) -> float:
    for k, mult in KEYS[figure].items():
        if _number(d.get(k)):
            return float(d[k]) * mult
    return 0.0


def _peaks(d: Mapping[str, Any]) -> dict[str, float]:
    for k, mult in KEYS["peak_flops"].items():
        v = d.get(k)
        if isinstance(v, Mapping):
            return {str(p): float(x) * mult for p, x in v.items() if _number(x)}
    out = {}
    for k, v in d.items():  # flat spellings: peak_flops_fp16, peak_tflops_bf16
        for prefix, mult in (("peak_flops_", 1.0), ("peak_tflops_", 1e12)):
            if k.startswith(prefix) and _number(v):
                out[k[len(prefix) :]] = float(v) * mult
    return out


def _efficiency(v: Any) -> dict[str, dict[str, float]]:
    if not isinstance(v, Mapping):
        return {}
    return {
        str(k): {str(p): float(x) for p, x in t.items() if _number(x)}
        for k, t in v.items()
        if isinstance(t, Mapping)
    }


def _entries(section: Any, kind: str) -> list[tuple[str, str, Mapping[str, Any]]]:
    """(id, type, entry) of a `chips` or `links` section, a table by id or a list; entries
    without an id are skipped. A missing type is the id's prefix (`gpu` of `host/gpu:0`)."""
    if isinstance(section, Mapping):
        pairs = [(str(k), v) for k, v in section.items()]
    elif isinstance(section, list):
        pairs = [("", v) for v in section]
    else:
        return []
    out = []
    for key, e in pairs:
        if not isinstance(e, Mapping):
            continue
        eid = str(next((e[k] for k in ID_KEYS[kind] if e.get(k)), key))
        if eid:
            given = next((e[k] for k in TYPE_KEYS[kind] if e.get(k)), None)
            out.append((eid, str(given or eid.rsplit("/", 1)[-1].split(":")[0]), e))
    return out


def parse_topology(manifest: Mapping[str, Any]) -> Topology:
    """The topology of one run manifest (a dict); unknown shapes give an empty Topology."""
    topo = manifest.get("topology") if isinstance(manifest, Mapping) else None
    if isinstance(topo, str):
        try:
            topo = json.loads(topo)
        except ValueError:
            return Topology()
    if not isinstance(topo, Mapping):
        return Topology()
    chips = {
        cid: ChipSpec(
            cid,
            ctype,
            str(c.get("model") or ""),
            _peaks(c),
            _figure(c, "memory_bytes"),
            _figure(c, "memory_bandwidth"),
            _figure(c, "launch_overhead_ns"),
            _efficiency(c.get("efficiency")),
        )
        for cid, ctype, c in _entries(topo.get("chips"), "chips")
    }
    links = [
        LinkSpec(
            lid,
            ltype,
            str(lk.get("src") or ""),
            str(lk.get("dst") or ""),
            _figure(lk, "bandwidth"),
            _figure(lk, "latency_ns"),
        )
        for lid, ltype, lk in _entries(topo.get("links"), "links")
    ]
    return Topology(
        chips,
        links,
        name=str(topo.get("name") or ""),
        source=str(topo.get("source") or ""),
        description=str(topo.get("description") or ""),
    )


def merge_topologies(manifests: Iterable[Mapping[str, Any]]) -> Topology:
    """One Topology from every writer's manifest (a distributed run has several); a later
    manifest's chip or link replaces an earlier one of the same id."""
    chips: dict[str, ChipSpec] = {}
    links: dict[str, LinkSpec] = {}
    for m in manifests:
        t = parse_topology(m)
        chips.update(t.chips)
        links.update((lk.id, lk) for lk in t.links)
    return Topology(chips, list(links.values()))


__all__ = [
    "ChipSpec",
    "LinkSpec",
    "Topology",
    "KEYS",
    "ID_KEYS",
    "TYPE_KEYS",
    "parse_topology",
    "merge_topologies",
]
