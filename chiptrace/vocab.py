"""The span vocabulary without Arrow: chip, link and op names, span kinds and statuses, the
attribute -> column map, chip/link parsing, span `Tags`, and the JSON encoder for attribute
maps.

The instrumentation path (`import chiptrace`, `@trace`, `span()`) needs only these; the
Arrow schema and conversions in chiptrace.schema (which re-exports every name here) load
with the recorder's writer, so `import chiptrace` loads neither NumPy nor pyarrow.
"""

from __future__ import annotations

import json
import json.encoder
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from chiptrace.errors import ChipError

SCHEMA_VERSION = 1
SCHEMA_VERSION_KEY = b"chiptrace.schema_version"

CHIP_TYPES = ("gpu", "cpu", "dpu", "npu", "nic", "switch")
# Appended, never reordered (the emulator encodes link types by their index here): nvlink4
# (H100) and nvlink3 (A100) came with the presets of the machines real traces come from.
LINK_TYPES = (
    "nvlink6",
    "nvlink5",
    "pcie5",
    "pcie4",
    "c2c",
    "ethernet",
    "infiniband",
    "nvlink4",
    "nvlink3",
)
# Appended, never reordered: the emulator encodes op kinds by their index here.
# memset, launch and sync came with the importers: device memsets, the runtime calls that
# launch device work (cudaLaunchKernel, hipMemcpyAsync, ...), and device synchronisations.
OP_KINDS = ("compute", "comm", "memcpy", "io", "idle", "host", "memset", "launch", "sync")
PRECISIONS = ("fp32", "bf16", "fp16", "fp8", "nvfp4", "int8")

# OTLP numbering, so exporters and the collector pass these through untouched.
SPAN_KIND_UNSPECIFIED, SPAN_KIND_INTERNAL, SPAN_KIND_SERVER = 0, 1, 2
SPAN_KIND_CLIENT, SPAN_KIND_PRODUCER, SPAN_KIND_CONSUMER = 3, 4, 5
STATUS_UNSET, STATUS_OK, STATUS_ERROR = 0, 1, 2

# OpenTelemetry attribute name -> column. Attributes outside this map stay in `attributes`.
ATTRIBUTE_COLUMNS = {
    "chip.id": "chip_id",
    "chip.type": "chip_type",
    "link.id": "link_id",
    "link.type": "link_type",
    "link.src": "link_src",
    "link.dst": "link_dst",
    "op.kind": "op_kind",
    "op.bytes": "op_bytes",
    "op.flops": "op_flops",
    "op.precision": "op_precision",
}
COLUMN_ATTRIBUTES = {v: k for k, v in ATTRIBUTE_COLUMNS.items()}


@dataclass(frozen=True, slots=True)
class Chip:
    """A parsed chip id: `gpu:3`, or `node1/gpu:3` when several hosts share a trace."""

    id: str
    type: str


@dataclass(frozen=True, slots=True)
class Link:
    """A parsed link: `nvlink6:gpu:0-gpu:1` is an NVLink 6 transfer from gpu:0 to gpu:1."""

    id: str
    type: str
    src: str | None = None
    dst: str | None = None


def parse_chip(chip_id: str) -> Chip:
    """Parse a chip id and check its type is one of the six.

    Raises:
        ChipError: the id is malformed or names an unknown chip type.
    """
    if not isinstance(chip_id, str) or not chip_id:
        raise ChipError(f"chip={chip_id!r}: expected a chip id like 'gpu:0'")
    local = chip_id.rsplit("/", 1)[-1]
    chip_type, sep, index = local.partition(":")
    if chip_type not in CHIP_TYPES:
        raise ChipError(
            f"unknown chip type {chip_type!r} in chip={chip_id!r}; "
            f"expected one of {', '.join(CHIP_TYPES)}"
        )
    if not sep or not index:
        raise ChipError(f"chip={chip_id!r}: expected TYPE:INDEX, for example '{chip_type}:0'")
    return Chip(chip_id, chip_type)


def chip_type_of(chip_id: object) -> str | None:
    """The chip type a chip id names (`gpu:3` and `node1/gpu:3` -> `gpu`), or None.

    Lenient where `parse_chip` is strict: spans that enter the store from elsewhere (the
    collector, importers) carry `chip.id` without `chip.type`, and a value that names no known
    type must cost that span its type, not the batch.
    """
    if not isinstance(chip_id, str):
        return None
    chip_type, sep, index = chip_id.rsplit("/", 1)[-1].partition(":")
    return chip_type if sep and index and chip_type in CHIP_TYPES else None


def parse_link(link: str) -> Link:
    """Parse `TYPE`, or `TYPE:SRC-DST` / `TYPE:SRC->DST` with SRC and DST chip ids.

    Raises:
        ChipError: unknown link type, or endpoints that are not chip ids.
    """
    if not isinstance(link, str) or not link:
        raise ChipError(f"link={link!r}: expected a link like 'nvlink6:gpu:0-gpu:1'")
    link_type, _, route = link.partition(":")
    if link_type not in LINK_TYPES:
        raise ChipError(
            f"unknown link type {link_type!r} in link={link!r}; "
            f"expected one of {', '.join(LINK_TYPES)}"
        )
    if not route:
        return Link(link, link_type)
    src, sep, dst = route.partition("->")
    if not sep:
        src, sep, dst = route.partition("-")
    if not sep:
        raise ChipError(f"link={link!r}: expected TYPE:SRC-DST, for example 'pcie5:cpu:0-gpu:0'")
    return Link(link, link_type, parse_chip(src).id, parse_chip(dst).id)


def check_choice(name: str, value: str, choices: tuple[str, ...]) -> str:
    """Return `value` if it is one of `choices`, else raise a ChipError naming the setting."""
    if value not in choices:
        raise ChipError(f"unknown {name} {value!r}; expected one of {', '.join(choices)}")
    return value


# One C encoder for every call: json.dumps with options builds a new encoder each time,
# which costs more than encoding a small attribute map. No circular-reference markers
# (a cycle ends in RecursionError, turned into ValueError below).
_encode = (
    json.encoder.c_make_encoder(  # type: ignore[attr-defined]
        None, str, json.encoder.encode_basestring_ascii, None, ":", ",", False, False, True
    )
    if getattr(json.encoder, "c_make_encoder", None)
    else None
)
_slow_encode = json.JSONEncoder(separators=(",", ":"), default=str).encode


def dumps(value: Any) -> str:
    """JSON for attribute maps, events and links: compact, and never fails on odd values
    (anything JSON has no type for is written as its str()).

    Raises:
        TypeError: a key that is not a string or number; ValueError: a cycle.
    """
    if _encode is None:
        return _slow_encode(value)
    try:
        return "".join(_encode(value, 0))
    except RecursionError:
        raise ValueError("circular reference") from None


# Chip types a bare `chip="gpu"` names this rank's own one of (see Tags.build).
LOCAL_CHIP_TYPES = ("gpu", "npu")


@dataclass(frozen=True, slots=True)
class Tags:
    """The static chip, link and op columns of a decorated function: parsed once, shared."""

    chip_id: str | None = None
    chip_type: str | None = None
    link_id: str | None = None
    link_type: str | None = None
    link_src: str | None = None
    link_dst: str | None = None
    op_kind: str | None = None
    op_precision: str | None = None
    attributes: Mapping[str, Any] | None = None

    @classmethod
    def build(
        cls,
        chip: str | None = None,
        link: str | None = None,
        op: str | None = None,
        precision: str | None = None,
        attributes: Mapping[str, Any] | None = None,
    ) -> Tags:
        """Validate the tags of a decorator or span() call: errors surface at decoration.

        A bare accelerator type (`chip="gpu"`, `"npu"`) is this process's own: index
        LOCAL_RANK, which torchrun sets in each rank (0 in a process started otherwise).
        """
        if chip in LOCAL_CHIP_TYPES:
            from chiptrace.config import local_rank

            chip = f"{chip}:{local_rank()}"
        c = parse_chip(chip) if chip is not None else None
        lk = parse_link(link) if link is not None else None
        if op is not None:
            check_choice("op kind", op, OP_KINDS)
        elif lk is not None:
            op = "comm"
        elif c is not None:
            op = "compute"
        if precision is not None:
            check_choice("precision", precision, PRECISIONS)
        return cls(
            chip_id=c.id if c else None,
            chip_type=c.type if c else None,
            link_id=lk.id if lk else None,
            link_type=lk.type if lk else None,
            link_src=lk.src if lk else None,
            link_dst=lk.dst if lk else None,
            op_kind=op,
            op_precision=precision,
            attributes=dict(attributes) if attributes else None,
        )


NO_TAGS = Tags()
TAG_COLUMNS = (
    "chip_id",
    "chip_type",
    "link_id",
    "link_type",
    "link_src",
    "link_dst",
    "op_kind",
    "op_precision",
)
