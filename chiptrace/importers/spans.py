"""OpenTelemetry-shaped span dicts -> span columns: for the formats that carry whole spans
(Jaeger JSON, chiptrace's own Chrome export), where each span is already a small dict.

`chip.*`, `link.*` and `op.*` attributes of the right type go to their typed columns (as the
collector does for OTLP); every other attribute stays in the JSON `attributes` column.
"""

from __future__ import annotations

from typing import Any

from chiptrace.schema import ATTRIBUTE_COLUMNS, chip_type_of, dumps

_INT_COLUMNS = ("op_bytes", "op_flops")
_BASE = ("name", "kind", "status_code", "status_message", "service", "events", "attributes")
STATUS_CODES = {"UNSET": 0, "OK": 1, "ERROR": 2}
KIND_CODES = {
    "unspecified": 0,
    "internal": 1,
    "server": 2,
    "client": 3,
    "producer": 4,
    "consumer": 5,
}


def split_attributes(attrs: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(typed column values, the remaining attributes) of one span's attribute map."""
    cols: dict[str, Any] = {}
    rest: dict[str, Any] = {}
    for key, value in attrs.items():
        col = ATTRIBUTE_COLUMNS.get(key)
        if col is not None and (
            isinstance(value, int) and not isinstance(value, bool)
            if col in _INT_COLUMNS
            else isinstance(value, str)
        ):
            cols[col] = value
        else:
            rest[key] = value
    if "chip_id" in cols and "chip_type" not in cols:
        cols["chip_type"] = chip_type_of(cols["chip_id"])
    return cols, rest


def columns_of(spans: list[dict[str, Any]]) -> dict[str, list[Any]]:
    """Column lists from span dicts with keys: name, kind, status_code, status_message,
    attributes (dict), events (list), service, plus anything split_attributes makes."""
    names = _BASE + tuple(ATTRIBUTE_COLUMNS.values())
    out: dict[str, list[Any]] = {n: [] for n in names}
    for sp in spans:
        typed, rest = split_attributes(sp.get("attributes") or {})
        out["name"].append(str(sp.get("name", "")))
        out["kind"].append(int(sp.get("kind", 1)))
        out["status_code"].append(int(sp.get("status_code", 0)))
        out["status_message"].append(sp.get("status_message"))
        out["service"].append(sp.get("service"))
        out["events"].append(dumps(sp["events"]) if sp.get("events") else None)
        out["attributes"].append(dumps(rest) if rest else None)
        for col in ATTRIBUTE_COLUMNS.values():
            out[col].append(typed.get(col))
    return out
