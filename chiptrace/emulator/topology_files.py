"""Rack topologies: chips and links declared in TOML, validated once, with routes.

The model (ChipSpec, LinkSpec, Topology) is chiptrace.topology's, shared with the report and
the dashboard; this module only reads and validates the TOML declaration.

A topology file declares chip models (peak FLOP/s per precision, memory size and
bandwidth), chips (a model and a count, ids numbered per type), and links (a type, two
endpoint sets, bandwidth per direction and latency). Presets ship in `presets/`; a path to a
TOML file works the same way. Every mistake is a TopologyError naming the file, the field
and the bad value.
"""

from __future__ import annotations

import math
import tomllib
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Any

from chiptrace.emulator import efficiency
from chiptrace.emulator.errors import TopologyError
from chiptrace.schema import CHIP_TYPES, LINK_TYPES, PRECISIONS
from chiptrace.topology import ChipSpec, LinkSpec, Topology

# Per-direction bandwidth (bytes/s) when a link omits it. Sources: PCI-SIG base specs
# (PCIe 4.0 x16 16 GT/s ~32 GB/s, PCIe 5.0 x16 ~64 GB/s), NVIDIA NVLink pages (NVLink 5:
# 1.8 TB/s per Blackwell GPU both ways; NVLink 6: 3.6 TB/s per Rubin GPU both ways),
# NVLink-C2C 900 GB/s both ways (Grace Hopper / Grace Blackwell), 400 Gb/s Ethernet and
# InfiniBand NDR ports (50 GB/s); NVLink 4: 900 GB/s per H100 both ways (18 links of
# 25 GB/s per direction); NVLink 3: 600 GB/s per A100 both ways (12 links of 25 GB/s).
DEFAULT_BANDWIDTH = {
    "pcie4": 32e9,
    "pcie5": 64e9,
    "nvlink5": 900e9,
    "nvlink6": 1.8e12,
    "c2c": 450e9,
    "ethernet": 50e9,
    "infiniband": 50e9,
    "nvlink4": 450e9,
    "nvlink3": 300e9,
}
DEFAULT_LATENCY_NS = 2_500.0  # base per-hop latency of the design (DESIGN.md)
# Chips that forward traffic between their links (root complexes, switches, NICs); GPUs
# and NPUs are endpoints only.
FORWARDERS = frozenset({"switch", "cpu", "nic", "dpu"})
PRESETS = ("rack6", "nvl72", "pcie8", "a100x8", "h100x8")


# ---------------------------------------------------------------- loading


def load_topology(name_or_path: str | Path) -> Topology:
    """Load a preset by name (see PRESETS) or a TOML file by path.

    Raises:
        TopologyError: unknown preset, unreadable file, or an invalid declaration.
    """
    text, source = _read(name_or_path)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise TopologyError(f"{source}: not valid TOML: {e}") from None
    return build_topology(data, source)


def _read(name_or_path: str | Path) -> tuple[str, str]:
    raw = str(name_or_path)
    if raw in PRESETS:
        path = resources.files("chiptrace.emulator").joinpath("presets", f"{raw}.toml")
        return path.read_text(), f"preset {raw}"
    path = Path(raw)
    if path.suffix == ".toml" or path.exists():
        try:
            return path.read_text(), str(path)
        except OSError as e:
            raise TopologyError(f"cannot read topology {raw!r}: {e.strerror}") from None
    raise TopologyError(
        f"unknown topology {raw!r}; expected a preset ({', '.join(PRESETS)}) or a .toml path"
    )


_MODEL_KEYS = (
    "type",
    "peak_tflops",
    "memory_GB",
    "memory_bandwidth_GBps",
    "launch_overhead_us",
    "efficiency",
)
_KEYS = {
    "": ("name", "description", "latency_us", "chip_models", "chips", "links"),
    "chip_models": _MODEL_KEYS,
    "chips": ("model", "count", *_MODEL_KEYS),
    "links": ("type", "a", "b", "connect", "bandwidth_GBps", "latency_us"),
}


def _known_keys(table: Any, section: str, source: str, where: str) -> None:
    """A misspelt key (`bandwith_GBps`) would silently fall back to a default: refuse it."""
    if not isinstance(table, Mapping):
        raise TopologyError(f"{source}: {where or 'the file'} must be a table")
    for key in table:
        if key not in _KEYS[section]:
            raise TopologyError(
                f"{source}: {where + '.' if where else ''}{key}: unknown key; expected one of "
                f"{', '.join(_KEYS[section])}"
            )


def build_topology(data: Mapping[str, Any], source: str = "<dict>") -> Topology:
    """Validate a parsed TOML document and build the Topology it declares."""
    _known_keys(data, "", source, "")
    for name, m in (data.get("chip_models") or {}).items():
        _known_keys(m, "chip_models", source, f"chip_models.{name}")
    for section in ("chips", "links"):
        items = data.get(section)
        for i, item in enumerate(items if isinstance(items, list) else []):
            _known_keys(item, section, source, f"{section}[{i}]")
    models = _models(data.get("chip_models", {}), source)
    chips = _chips(data.get("chips"), models, source)
    links = _links(data.get("links"), chips, source, float(data.get("latency_us", 2.5)) * 1e3)
    return Topology(
        name=str(data.get("name") or Path(source).stem),
        source=source,
        chips=chips,
        links=links,
        description=str(data.get("description", "")),
    )


def _num(source: str, where: str, key: str, value: Any, *, positive: bool = True) -> float:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or (positive and value <= 0) or (not positive and value < 0):
        want = "a number > 0" if positive else "a number >= 0"
        raise TopologyError(f"{source}: {where}.{key} = {value!r}: expected {want}")
    return float(value)


def _models(raw: Any, source: str) -> dict[str, dict[str, Any]]:
    if not isinstance(raw, Mapping):
        raise TopologyError(f"{source}: chip_models must be a table of models")
    models: dict[str, dict[str, Any]] = {}
    for name, m in raw.items():
        where = f"chip_models.{name}"
        if not isinstance(m, Mapping):
            raise TopologyError(f"{source}: {where} must be a table")
        models[name] = _model_figures(m, source, where)
    return models


def _model_figures(m: Mapping[str, Any], source: str, where: str) -> dict[str, Any]:
    ctype = m.get("type")
    if ctype not in CHIP_TYPES:
        raise TopologyError(
            f"{source}: {where}.type = {ctype!r}: unknown chip type; expected one of "
            f"{', '.join(CHIP_TYPES)}"
        )
    peaks = m.get("peak_tflops", {})
    if not isinstance(peaks, Mapping):
        raise TopologyError(f"{source}: {where}.peak_tflops must be a table precision = TFLOP/s")
    flops = {}
    for prec, v in peaks.items():
        if prec not in PRECISIONS:
            raise TopologyError(
                f"{source}: {where}.peak_tflops.{prec}: unknown precision; expected one of "
                f"{', '.join(PRECISIONS)}"
            )
        flops[prec] = _num(source, f"{where}.peak_tflops", prec, v) * 1e12
    mem = m.get("memory_GB", 0)
    bw = m.get("memory_bandwidth_GBps", 0)
    return {
        "type": ctype,
        "peak_flops": flops,
        "memory_bytes": _num(source, where, "memory_GB", mem, positive=False) * 1e9,
        "memory_bandwidth": _num(source, where, "memory_bandwidth_GBps", bw, positive=False) * 1e9,
        "launch_overhead_ns": _num(
            source, where, "launch_overhead_us", m.get("launch_overhead_us", 0), positive=False
        )
        * 1e3,
        "efficiency": efficiency.parse_table(
            m.get("efficiency", {}), source, f"{where}.efficiency"
        ),
    }


def _chips(raw: Any, models: Mapping[str, dict[str, Any]], source: str) -> dict[str, ChipSpec]:
    if not isinstance(raw, list) or not raw:
        raise TopologyError(f"{source}: chips: expected a non-empty list of [[chips]] tables")
    chips: dict[str, ChipSpec] = {}
    next_index = dict.fromkeys(CHIP_TYPES, 0)
    for i, c in enumerate(raw):
        where = f"chips[{i}]"
        model = c.get("model")
        if model is None:
            figures, model = _model_figures(c, source, where), str(c.get("type"))
        elif model in models:
            figures = models[model]
        else:
            raise TopologyError(
                f"{source}: {where}.model = {model!r}: not in chip_models "
                f"({', '.join(models) or 'none declared'})"
            )
        count = c.get("count", 1)
        if not isinstance(count, int) or isinstance(count, bool) or count < 1:
            raise TopologyError(f"{source}: {where}.count = {count!r}: expected an integer >= 1")
        ctype = figures["type"]
        for _ in range(count):
            cid = f"{ctype}:{next_index[ctype]}"
            next_index[ctype] += 1
            chips[cid] = ChipSpec(
                cid, ctype, model, **{k: v for k, v in figures.items() if k != "type"}
            )
    return chips


def expand(pattern: Any, chips: Mapping[str, ChipSpec], source: str, where: str) -> list[str]:
    """Chip ids from `gpu:3`, `gpu:*`, `gpu:0..3` (inclusive) or a list of those."""
    if isinstance(pattern, list):
        return [c for p in pattern for c in expand(p, chips, source, where)]
    if not isinstance(pattern, str):
        raise TopologyError(f"{source}: {where} = {pattern!r}: expected a chip id like 'gpu:0'")
    ctype, _, index = pattern.partition(":")
    if ctype not in CHIP_TYPES:
        raise TopologyError(
            f"{source}: {where} = {pattern!r}: unknown chip type {ctype!r}; expected one of "
            f"{', '.join(CHIP_TYPES)}"
        )
    if index == "*":
        ids = [c for c, spec in chips.items() if spec.type == ctype]
    elif ".." in index:
        lo, _, hi = index.partition("..")
        if not (lo.isdigit() and hi.isdigit()):
            raise TopologyError(f"{source}: {where} = {pattern!r}: expected TYPE:LO..HI")
        ids = [f"{ctype}:{k}" for k in range(int(lo), int(hi) + 1)]
    else:
        ids = [pattern]
    missing = [c for c in ids if c not in chips]
    if missing or not ids:
        raise TopologyError(
            f"{source}: {where} = {pattern!r}: no chip {missing[0] if missing else pattern} in this topology"
        )
    return ids


def _links(
    raw: Any, chips: Mapping[str, ChipSpec], source: str, default_lat: float
) -> list[LinkSpec]:
    if not isinstance(raw, list):
        raise TopologyError(f"{source}: links: expected a list of [[links]] tables")
    links: list[LinkSpec] = []
    seen: set[str] = set()
    for i, lk in enumerate(raw):
        where = f"links[{i}]"
        ltype = lk.get("type")
        if ltype not in LINK_TYPES:
            raise TopologyError(
                f"{source}: {where}.type = {ltype!r}: unknown link type; expected one of "
                f"{', '.join(LINK_TYPES)}"
            )
        bw = (
            _num(source, where, "bandwidth_GBps", lk["bandwidth_GBps"]) * 1e9
            if "bandwidth_GBps" in lk
            else DEFAULT_BANDWIDTH[ltype]
        )
        lat = (
            _num(source, where, "latency_us", lk["latency_us"], positive=False) * 1e3
            if "latency_us" in lk
            else default_lat
        )
        for a, b in _pairs(lk, chips, source, where):
            if a == b:
                raise TopologyError(f"{source}: {where}: a link from {a} to itself")
            lid = f"{ltype}:{a}-{b}"
            if lid in seen:
                raise TopologyError(f"{source}: {where}: link {lid} declared twice")
            seen.add(lid)
            links.append(LinkSpec(lid, ltype, a, b, bw, lat))
    return links


def _pairs(
    lk: Mapping[str, Any], chips: Mapping[str, ChipSpec], source: str, where: str
) -> list[tuple[str, str]]:
    for key in ("a", "b"):
        if key not in lk:
            raise TopologyError(
                f"{source}: {where}.{key} is missing: expected a chip id like 'gpu:0'"
            )
    a = expand(lk["a"], chips, source, f"{where}.a")
    b = expand(lk["b"], chips, source, f"{where}.b")
    connect = lk.get("connect", "all")
    if connect == "all":
        return [(x, y) for x in a for y in b]
    if connect == "blocks":
        # a[i] joins b[i * len(b) // len(a)]: gpu:0..7 in blocks of 4 onto cpu:0..1.
        if len(a) < len(b):
            raise TopologyError(f"{source}: {where}: connect = 'blocks' needs len(a) >= len(b)")
        return [(x, b[k * len(b) // len(a)]) for k, x in enumerate(a)]
    raise TopologyError(f"{source}: {where}.connect = {connect!r}: expected 'all' or 'blocks'")


__all__ = [
    "ChipSpec",
    "LinkSpec",
    "Topology",
    "PRESETS",
    "FORWARDERS",
    "DEFAULT_BANDWIDTH",
    "build_topology",
    "load_topology",
    "expand",
]
