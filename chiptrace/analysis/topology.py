"""What the run manifests say about the hardware: peak FLOP/s, memory and link bandwidth.

The emulator records a ``topology`` in its manifest; decorated code usually records none, and
then every rule that needs a peak or a bandwidth falls back to comparing chips and links with
their peers. Parsing is lenient about units and key spellings (``bandwidth_Bps`` or
``bandwidth_GBps``, ``latency_ns`` or ``latency_us``) because manifests outlive code versions.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

# key -> multiplier to base units (bytes/s, ns, FLOP/s)
_BW_KEYS = {
    "bandwidth_Bps": 1.0,
    "bandwidth_bytes_per_s": 1.0,
    "bandwidth_GBps": 1e9,
    "bandwidth_gbps": 1e9 / 8,
    "bandwidth_bps": 1 / 8,
    "bandwidth": 1.0,
    "bw": 1.0,
}
_LAT_KEYS = {"latency_ns": 1.0, "latency_us": 1e3, "latency_s": 1e9, "latency": 1e9}
_MEMBW_KEYS = {
    "memory_bandwidth_Bps": 1.0,
    "mem_bw_Bps": 1.0,
    "memory_bandwidth_GBps": 1e9,
    "mem_bw_GBps": 1e9,
    "memory_bandwidth": 1.0,
    "mem_bw": 1.0,
    "hbm_bandwidth_Bps": 1.0,
}
_PEAK_KEYS = {"peak_flops": 1.0, "peak": 1.0, "peak_tflops": 1e12, "flops": 1.0}


@dataclass(frozen=True, slots=True)
class ChipSpec:
    """One chip's figures: peak FLOP/s per precision, memory bandwidth (bytes/s), model."""

    id: str
    type: str
    peak_flops: dict[str, float] = field(default_factory=dict)
    memory_bandwidth: float | None = None
    model: str | None = None


@dataclass(frozen=True, slots=True)
class LinkSpec:
    """One link's figures: bandwidth per direction (bytes/s) and latency (ns)."""

    id: str
    type: str | None
    bandwidth: float | None
    latency_ns: float | None
    src: str | None = None
    dst: str | None = None


@dataclass(frozen=True, slots=True)
class Topology:
    """Chips and links by id; empty when no manifest recorded a topology."""

    chips: dict[str, ChipSpec] = field(default_factory=dict)
    links: dict[str, LinkSpec] = field(default_factory=dict)

    @property
    def known(self) -> bool:
        return bool(self.chips or self.links)

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
        return spec.model if spec else None

    def bandwidth(self, link_id: str | None) -> float | None:
        spec = self.links.get(link_id or "")
        return spec.bandwidth if spec else None


def _first(d: Mapping[str, Any], keys: Mapping[str, float]) -> float | None:
    for k, mult in keys.items():
        v = d.get(k)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0:
            return float(v) * mult
    return None


def _peaks(d: Mapping[str, Any]) -> dict[str, float]:
    for k, mult in _PEAK_KEYS.items():
        v = d.get(k)
        if isinstance(v, Mapping):
            return {
                str(p): float(x) * mult
                for p, x in v.items()
                if isinstance(x, (int, float)) and x > 0
            }
    out = {}
    for k, v in d.items():  # flat spellings: peak_flops_fp16, peak_tflops_bf16
        for prefix, mult in (("peak_flops_", 1.0), ("peak_tflops_", 1e12)):
            if k.startswith(prefix) and isinstance(v, (int, float)) and v > 0:
                out[k[len(prefix) :]] = float(v) * mult
    return out


def _items(section: Any) -> Iterable[tuple[str | None, Mapping[str, Any]]]:
    if isinstance(section, Mapping):
        return [(str(k), v) for k, v in section.items() if isinstance(v, Mapping)]
    if isinstance(section, list):
        return [(None, v) for v in section if isinstance(v, Mapping)]
    return []


def parse_topology(manifest: Mapping[str, Any]) -> Topology:
    """The topology of one manifest (a dict); unknown shapes give an empty Topology."""
    topo = manifest.get("topology")
    if isinstance(topo, str):
        try:
            topo = json.loads(topo)
        except ValueError:
            return Topology()
    if not isinstance(topo, Mapping):
        return Topology()
    chips: dict[str, ChipSpec] = {}
    for key, c in _items(topo.get("chips")):
        cid = str(c.get("id") or c.get("chip_id") or key or "")
        if cid:
            ctype = str(c.get("type") or c.get("chip_type") or cid.rsplit("/", 1)[-1].split(":")[0])
            model = c.get("model")
            chips[cid] = ChipSpec(
                cid, ctype, _peaks(c), _first(c, _MEMBW_KEYS), str(model) if model else None
            )
    links: dict[str, LinkSpec] = {}
    for key, lk in _items(topo.get("links")):
        lid = str(lk.get("id") or lk.get("link_id") or key or "")
        if lid:
            links[lid] = LinkSpec(
                lid,
                lk.get("type") or lk.get("link_type"),
                _first(lk, _BW_KEYS),
                _first(lk, _LAT_KEYS),
                lk.get("src"),
                lk.get("dst"),
            )
    return Topology(chips, links)


def merge_topologies(manifests: Iterable[Mapping[str, Any]]) -> Topology:
    """One Topology from every writer's manifest (a distributed run has several)."""
    chips: dict[str, ChipSpec] = {}
    links: dict[str, LinkSpec] = {}
    for m in manifests:
        t = parse_topology(m)
        chips.update(t.chips)
        links.update(t.links)
    return Topology(chips, links)
