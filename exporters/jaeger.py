"""Jaeger JSON: the format the Jaeger UI loads from disk ("JSON File" upload) and its query
API returns: `{"data": [trace, ...]}`, times in microseconds, typed tags, processes.

Each trace lists its processes (`p1`, `p2`, ...: one per service and host, with the
resource attributes and `host.name` as tags), its spans with CHILD_OF references to their
parent and FOLLOWS_FROM references for their links, and events as logs, following the
mapping Jaeger's own OTLP translator uses (`span.kind`, `otel.status_code`, `error`,
`otel.scope.name` tags). `read_jaeger_json` reads such a file back and checks it.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
from chiptrace.exporters import attributes as A

from chiptrace.errors import ChiptraceError

log = logging.getLogger("chiptrace")

_HEX = re.compile(r"^[0-9a-fA-F]{1,32}$")


class JaegerFormatError(ChiptraceError):
    """A Jaeger JSON file that does not follow the format."""


def tag(key: str, value: Any) -> dict[str, Any]:
    """A typed Jaeger tag; lists and maps become JSON strings, as Jaeger's translator does."""
    if isinstance(value, bool):
        return {"key": key, "type": "bool", "value": value}
    if isinstance(value, int):
        return {"key": key, "type": "int64", "value": value}
    if isinstance(value, float):
        return {"key": key, "type": "float64", "value": value}
    if isinstance(value, str):
        return {"key": key, "type": "string", "value": value}
    return {"key": key, "type": "string", "value": json.dumps(value, separators=(",", ":"))}


def _span_tags(row: dict[str, Any]) -> list[dict[str, Any]]:
    tags = [tag(k, v) for k, v in A.attributes(row).items()]
    tags.append(tag("otel.scope.name", row.get("scope") or "chiptrace"))
    if row.get("kind") not in (None, 0, 1):
        tags.append(tag("span.kind", A.KIND_NAMES.get(row["kind"], "internal")))
    code = row.get("status_code") or 0
    if code:
        tags.append(tag("otel.status_code", A.STATUS_NAMES[code]))
    if code == 2:
        tags.append(tag("error", True))
    if row.get("status_message"):
        tags.append(tag("otel.status_description", row["status_message"]))
    return tags


def _logs(row: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for ev in A.events(row):
        fields = [tag("event", str(ev.get("name", "")))]
        fields += [tag(k, v) for k, v in (ev.get("attributes") or {}).items()]
        out.append({"timestamp": int(ev.get("time_ns", 0)) // 1000, "fields": fields})
    return out


def _references(row: dict[str, Any], trace_id: str) -> list[dict[str, str]]:
    refs = []
    if row.get("parent_span_id") is not None:
        refs.append({"refType": "CHILD_OF", "traceID": trace_id, "spanID": A.hex_id(row["parent_span_id"])})
    for lk in A.links(row):
        refs.append({"refType": "FOLLOWS_FROM", "traceID": lk["trace_id"], "spanID": lk["span_id"]})
    return refs


def _process(row: dict[str, Any]) -> dict[str, Any]:
    res = A.resource(row)
    service = res.get("service.name") or row.get("service") or "chiptrace"
    tags = [tag(k, v) for k, v in res.items() if k != "service.name"]
    if row.get("host") and "host.name" not in res:
        tags.append(tag("host.name", row["host"]))
    return {"serviceName": str(service), "tags": tags}


def _span(row: dict[str, Any], trace_id: str, process_id: str) -> dict[str, Any]:
    start_us = row["start_ns"] // 1000
    return {
        "traceID": trace_id,
        "spanID": A.hex_id(row["span_id"]),
        "flags": 1,
        "operationName": row["name"],
        "references": _references(row, trace_id),
        "startTime": start_us,
        "duration": max(0, (row["end_ns"] - row["start_ns"]) // 1000),
        "tags": _span_tags(row),
        "logs": _logs(row),
        "processID": process_id,
        "warnings": None,
    }


def to_jaeger(rows: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """Jaeger JSON (the query API's `{"data": [...]}` envelope) from span rows.

    Args:
        rows: span rows (spans_raw columns), ideally sorted by trace, then start.
    """
    traces: dict[str, dict[str, Any]] = {}
    for row in rows:
        trace_id = A.hex_id(row["trace_id"])
        tr = traces.get(trace_id)
        if tr is None:
            tr = traces[trace_id] = {"traceID": trace_id, "spans": [], "processes": {}, "warnings": None}
            tr["_pids"] = {}
        key = (row.get("service"), row.get("host"), row.get("resource"))
        pid = tr["_pids"].get(key)
        if pid is None:
            pid = tr["_pids"][key] = f"p{len(tr['_pids']) + 1}"
            tr["processes"][pid] = _process(row)
        tr["spans"].append(_span(row, trace_id, pid))
    for tr in traces.values():
        del tr["_pids"]
    data = list(traces.values())
    return {"data": data, "total": len(data), "limit": 0, "offset": 0, "errors": None}


def write_jaeger_json(table: pa.Table, path: str | os.PathLike[str]) -> int:
    """Write spans as a Jaeger JSON file; returns the number of traces written.

    Raises:
        ChiptraceError: the file cannot be written.
    """
    doc = to_jaeger(table.to_pylist())
    try:
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(json.dumps(doc, separators=(",", ":")))  # one-shot: the C encoder, ~3x faster
    except OSError as e:
        raise ChiptraceError(f"cannot write {path}: {e.strerror}") from e
    return len(doc["data"])


@dataclass
class JaegerFile:
    """What `read_jaeger_json` found: traces, span counts, and problems worth a warning."""

    traces: list[dict[str, Any]]
    spans: int = 0
    warnings: list[str] = field(default_factory=list)


def _check_id(path: Any, where: str, name: str, value: Any, digits: int) -> None:
    if not isinstance(value, str) or not _HEX.match(value) or len(value) > digits:
        raise JaegerFormatError(
            f"{path}: {where}: {name}={value!r} is not a hex id (expected up to {digits} hex digits)"
        )


def _check_trace(path: Any, tr: Any, out: JaegerFile) -> None:
    if not isinstance(tr, dict) or not isinstance(tr.get("spans"), list):
        raise JaegerFormatError(f"{path}: a trace without a 'spans' list")
    _check_id(path, "trace", "traceID", tr.get("traceID"), 32)
    seen: set[str] = set()
    for i, sp in enumerate(tr["spans"]):
        where = f"trace {tr['traceID']} span #{i}"
        for key in ("spanID", "operationName", "startTime", "duration"):
            if key not in sp:
                raise JaegerFormatError(f"{path}: {where}: missing {key!r}")
        _check_id(path, where, "spanID", sp["spanID"], 16)
        if sp["spanID"] in seen:
            out.warnings.append(f"{where}: duplicate spanID {sp['spanID']}")
        seen.add(sp["spanID"])
        if not isinstance(sp["startTime"], int) or not isinstance(sp["duration"], int):
            raise JaegerFormatError(f"{path}: {where}: startTime/duration must be integer microseconds")
    for sp in tr["spans"]:
        for ref in sp.get("references") or []:
            _check_id(path, f"trace {tr['traceID']} span {sp['spanID']}", "reference spanID", ref.get("spanID"), 16)
            if ref.get("refType") == "CHILD_OF" and ref.get("traceID") == tr["traceID"] and ref["spanID"] not in seen:
                out.warnings.append(f"trace {tr['traceID']} span {sp['spanID']}: parent {ref['spanID']} is missing")
    out.traces.append(tr)
    out.spans += len(tr["spans"])


def read_jaeger_json(path: str | os.PathLike[str]) -> JaegerFile:
    """Read a Jaeger JSON file (`{"data": [...]}` or one bare trace) and check it.

    Non-hex ids and missing fields raise; duplicate span ids and CHILD_OF references to
    spans not in the trace are returned as warnings (and logged), since Jaeger shows them.

    Raises:
        JaegerFormatError: not JSON, or not the Jaeger trace format.
    """
    try:
        with open(path, encoding="utf-8") as fh:
            doc = json.load(fh)
    except OSError as e:
        raise JaegerFormatError(f"cannot read {path}: {e.strerror}") from e
    except ValueError as e:
        raise JaegerFormatError(f"{path}: not JSON ({e})") from e
    traces = doc.get("data") if isinstance(doc, dict) and "data" in doc else [doc]
    if not isinstance(traces, list):
        raise JaegerFormatError(f"{path}: 'data' must be a list of traces")
    out = JaegerFile([])
    for tr in traces:
        _check_trace(path, tr, out)
    for w in out.warnings:
        log.warning("chiptrace: %s: %s", path, w)
    return out
