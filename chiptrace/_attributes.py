"""A stored span's OpenTelemetry view, row by row: attributes, events, links, resource.

The one stored row -> OTel mapping: the SDK bridge (`_otel.py`) and the file exporters
(Jaeger JSON, Chrome JSON) work on rows through it; the OTLP encoder has its own columnar
path and its tests compare against `attributes` here. Typed chip/link/op columns turn back
into `chip.id`, `link.type`, ... over the JSON `attributes` column with its JSON types.
Lenient: a malformed JSON column reads as empty rather than failing an export.
"""

from __future__ import annotations

import json
import math
from typing import Any

from chiptrace.schema import COLUMN_ATTRIBUTES

KIND_NAMES = {
    0: "unspecified",
    1: "internal",
    2: "server",
    3: "client",
    4: "producer",
    5: "consumer",
}
STATUS_NAMES = {0: "UNSET", 1: "OK", 2: "ERROR"}


def _loads(text: str | None, default: Any) -> Any:
    if not text:
        return default
    try:
        return json.loads(text)
    except ValueError:
        return default


def attributes(row: dict[str, Any]) -> dict[str, Any]:
    """Span attributes: the JSON column first, then the typed columns (which win)."""
    attrs = _loads(row.get("attributes"), {})
    attrs = dict(attrs) if isinstance(attrs, dict) else {}
    for col, key in COLUMN_ATTRIBUTES.items():
        value = row.get(col)
        if value is not None:
            attrs[key] = value
    return attrs


MAX_SAFE_INT = 2**53 - 1  # beyond it a JSON number loses digits in JavaScript (the UIs)


# JSON has no NaN or infinities (JSON.parse rejects the whole file on one): they are written
# as the strings the OTLP JSON encoding uses for doubles.
_NON_FINITE = {"nan": "NaN", "inf": "Infinity", "-inf": "-Infinity"}


def json_safe(value: Any, big_ints: bool = True) -> Any:
    """`value` as strict JSON takes it: every integer beyond 2^53 as a decimal string, as
    Jaeger writes them (the Jaeger UI and Perfetto read JSON numbers as doubles:
    1152921504606846979 would show as 1152921504606847000), and NaN and infinities as
    "NaN", "Infinity", "-Infinity", as the OTLP JSON encoding writes them.
    `big_ints=False` leaves integers as they are (JSON text inside a string stays exact)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else _NON_FINITE[repr(value)]
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value) if big_ints and abs(value) > MAX_SAFE_INT else value
    if isinstance(value, dict):
        return {k: json_safe(v, big_ints) for k, v in value.items()}
    if isinstance(value, list):
        return [json_safe(v, big_ints) for v in value]
    return value


def events(row: dict[str, Any]) -> list[dict[str, Any]]:
    """`[{"name", "time_ns", "attributes"}]` from the events column."""
    evs = _loads(row.get("events"), [])
    return [e for e in evs if isinstance(e, dict)] if isinstance(evs, list) else []


def links(row: dict[str, Any]) -> list[dict[str, Any]]:
    """`[{"trace_id", "span_id", "attributes"}]` (hex ids) from the links column.

    A link without a trace id points into the span's own trace.
    """
    lks = _loads(row.get("links"), [])
    out = []
    for lk in lks if isinstance(lks, list) else []:
        if isinstance(lk, dict) and lk.get("span_id"):
            trace = lk.get("trace_id") or _hex(row.get("trace_id"))
            out.append(
                {
                    "trace_id": trace,
                    "span_id": lk["span_id"],
                    "attributes": lk.get("attributes") or {},
                }
            )
    return out


def resource(row: dict[str, Any]) -> dict[str, Any]:
    """Resource attributes from the resource JSON column."""
    res = _loads(row.get("resource"), {})
    return res if isinstance(res, dict) else {}


def _hex(value: Any) -> str:
    if value is None:
        return ""
    return value.hex() if isinstance(value, bytes) else str(value)


def hex_id(value: Any) -> str:
    """An id as lowercase hex (ids are BLOBs in spans_raw)."""
    return _hex(value)
