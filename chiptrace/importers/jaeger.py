"""Jaeger JSON (`{"data": [traces]}` as the UI and the query API give it, one bare trace, or
a bare array of spans)
-> span batches. Tags are typed attributes (chip.*, link.*, op.* to their columns),
CHILD_OF the parent, FOLLOWS_FROM links, logs events, the process the resource. Jaeger
keeps microseconds, so times come back to the microsecond.

`read_jaeger_json` is the one Jaeger JSON reader: it decodes and checks a file (the
importer builds on it; the Jaeger exporter's tests read their own output back with it).
Non-hex ids and missing fields raise; duplicate span ids and CHILD_OF references to spans
not in the trace are warnings, since Jaeger shows such traces."""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pyarrow as pa

from chiptrace.importers.jaeger_context import ContextCopies
from chiptrace.importers.plan import FileFacts
from chiptrace.importers.source import TraceFormatError, read_all
from chiptrace.importers.spans import KIND_CODES, STATUS_CODES, columns_of
from chiptrace.schema import batch_from_columns, dumps, ids_to_binary, trace_ids_to_binary

_BATCH = 1 << 16
_HEX = re.compile(r"^[0-9a-fA-F]{1,32}$")
log = logging.getLogger("chiptrace")


class JaegerFormatError(TraceFormatError):
    """A Jaeger JSON file that does not follow the format."""


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
        raise JaegerFormatError(f"{path}: a trace without a 'spans' list; expected Jaeger JSON")
    _check_id(path, "trace", "traceID", tr.get("traceID"), 32)
    seen: set[str] = set()
    for i, sp in enumerate(tr["spans"]):
        where = f"trace {tr['traceID']} span #{i}"
        if not isinstance(sp, dict):
            raise JaegerFormatError(f"{path}: {where}: expected a span object")
        for key in ("spanID", "operationName", "startTime", "duration"):
            if key not in sp:
                raise JaegerFormatError(f"{path}: {where}: missing {key!r}")
        _check_id(path, where, "spanID", sp["spanID"], 16)
        if sp["spanID"] in seen:
            out.warnings.append(f"{where}: duplicate spanID {sp['spanID']}")
        seen.add(sp["spanID"])
        if not isinstance(sp["startTime"], int) or not isinstance(sp["duration"], int):
            raise JaegerFormatError(
                f"{path}: {where}: startTime/duration must be integer microseconds"
            )
    for sp in tr["spans"]:
        for ref in sp.get("references") or []:
            where = f"trace {tr['traceID']} span {sp['spanID']}"
            _check_id(path, where, "reference spanID", ref.get("spanID"), 16)
            if (
                ref.get("refType") == "CHILD_OF"
                and ref.get("traceID", tr["traceID"]) == tr["traceID"]
                and ref["spanID"] not in seen
            ):
                out.warnings.append(f"{where}: parent {ref['spanID']} is missing")
    out.traces.append(tr)
    out.spans += len(tr["spans"])


def read_jaeger_json(path: str | os.PathLike[str]) -> JaegerFile:
    """Read a Jaeger JSON file (`{"data": [...]}` or one bare trace; gzipped or not) and
    check it. Warnings are returned and logged.

    Raises:
        JaegerFormatError: not JSON, or not the Jaeger trace format.
    """
    try:
        doc = msgspec.json.decode(read_all(path))
    except msgspec.DecodeError as e:
        raise JaegerFormatError(f"{path}: not JSON ({e}); expected Jaeger JSON") from None
    traces = doc.get("data") if isinstance(doc, dict) and "data" in doc else [doc]
    if isinstance(doc, list):  # a bare array of spans (jaeger's anonymizer/uiconv files)
        traces = _group_spans(path, doc)
    if not isinstance(traces, list):
        raise JaegerFormatError(f'{path}: expected Jaeger JSON: {{"data": [traces]}}')
    out = JaegerFile([])
    for tr in traces:
        _check_trace(path, tr, out)
    for w in out.warnings:
        log.warning("chiptrace: %s: %s", path, w)
    return out


def _group_spans(path: Any, spans: list[Any]) -> list[dict[str, Any]]:
    """A bare array of spans, each with its traceID (and process inline), as traces."""
    by_trace: dict[str, list[Any]] = {}
    for i, sp in enumerate(spans):
        if not isinstance(sp, dict) or "traceID" not in sp:
            raise JaegerFormatError(
                f"{path}: element #{i} of the array is not a Jaeger span with a traceID"
            )
        by_trace.setdefault(str(sp["traceID"]), []).append(sp)
    return [{"traceID": t, "spans": sps} for t, sps in by_trace.items()]


def _tags(tags: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for t in tags if isinstance(tags, list) else []:
        if isinstance(t, dict) and isinstance(t.get("key"), str):
            out[t["key"]] = _typed(t.get("type"), t.get("value"))
    return out


def _typed(kind: Any, value: Any) -> Any:
    """A tag's value by its type: int64s past 2^53 and non-finite float64s come as
    strings ("1152921504606846979", "NaN", "Infinity"), as the exporters write them."""
    if isinstance(value, str) and kind in ("int64", "float64"):
        try:
            return int(value) if kind == "int64" else float(value)
        except ValueError:
            return value
    return value


def _id(path: Path, value: Any, size: int, what: str) -> bytes:
    try:
        if isinstance(value, str) and 0 < len(value) <= size * 2:
            return bytes.fromhex(value.rjust(size * 2, "0"))
    except ValueError:
        pass
    raise TraceFormatError(f"{path}: {what}={value!r}: expected up to {size * 2} hex digits")


def _span(
    path: Path, sp: dict[str, Any], trace_id: str, processes: dict[str, Any]
) -> dict[str, Any]:
    trace = _id(path, sp.get("traceID") or trace_id, 16, "traceID")
    attrs = _tags(sp.get("tags"))
    parent, links = None, []
    for ref in sp.get("references") or []:
        rid = _id(path, ref.get("spanID"), 8, "reference spanID")
        rtrace = _id(path, ref.get("traceID") or trace.hex(), 16, "reference traceID")
        if ref.get("refType") == "CHILD_OF" and parent is None and rtrace == trace:
            parent = rid
        else:
            links.append({"trace_id": rtrace.hex(), "span_id": rid.hex(), "attributes": {}})
    proc = processes.get(sp.get("processID") or "") or sp.get("process") or {}
    res = {"service.name": proc.get("serviceName", "jaeger"), **_tags(proc.get("tags"))}
    status = attrs.pop("otel.status_code", None)
    code = (
        STATUS_CODES.get(str(status).upper(), 0)
        if status
        else (2 if attrs.get("error") is True else 0)
    )
    attrs.pop("error", None) if code == 2 else None
    start = int(sp["startTime"]) * 1000
    return {
        "trace": trace,
        "span": int.from_bytes(_id(path, sp["spanID"], 8, "spanID"), "big"),
        "parent": int.from_bytes(parent, "big") if parent else 0,
        "start": start,
        "end": start + int(sp["duration"]) * 1000,
        "name": sp["operationName"],
        "kind": KIND_CODES.get(str(attrs.pop("span.kind", "internal")), 1),
        "status_code": code,
        "status_message": attrs.pop("otel.status_description", None),
        "scope": attrs.pop("otel.scope.name", None),
        "service": str(res["service.name"]),
        "host": res.get("host.name"),
        "resource": dumps(res),
        "links": dumps(links) if links else None,
        "events": [
            {
                "name": str(f.pop("event", "log")),
                "time_ns": int(lg.get("timestamp", 0)) * 1000,
                "attributes": f,
            }
            for lg in sp.get("logs") or []
            for f in [_tags(lg.get("fields"))]
        ],
        "attributes": attrs,
    }


def batch_of(spans: list[dict[str, Any]]) -> pa.RecordBatch:
    """The span records of `_span` as one batch."""
    cols: dict[str, Any] = columns_of(spans)
    cols["trace_id"] = trace_ids_to_binary([s["trace"] for s in spans])
    cols["span_id"] = ids_to_binary(np.array([s["span"] for s in spans], np.uint64))
    cols["parent_span_id"] = ids_to_binary(
        np.array([s["parent"] for s in spans], np.uint64), zero_is_null=True
    )
    for key, col in (("start", "start_ns"), ("end", "end_ns")):
        cols[col] = np.array([s[key] for s in spans], np.int64)
    for col in ("scope", "host", "resource", "links"):
        cols[col] = [s[col] for s in spans]
    return batch_from_columns(cols, len(spans))


def read_jaeger(
    path: Path, facts: FileFacts, context: ContextCopies | None = None
) -> Iterator[pa.RecordBatch]:
    """Span batches of a Jaeger JSON file. With `context` (one for every file of an
    import), copies tagged `chiptrace.context` are held back there, not read out.

    Raises:
        TraceFormatError: not JSON, or not Jaeger's trace shape.
    """
    facts.tally = {"skipped": {}}
    facts.categories = {"span": 0}  # spans read out: held context copies come later
    spans: list[dict[str, Any]] = []
    for tr in read_jaeger_json(path).traces:
        raw_procs = tr.get("processes")
        procs: dict[str, Any] = raw_procs if isinstance(raw_procs, dict) else {}
        facts.events += len(tr["spans"])
        for sp in tr["spans"]:
            span = _span(path, sp, tr["traceID"], procs)
            if context is not None and context.take(span, facts):
                continue
            spans.append(span)
            facts.categories["span"] += 1
            if len(spans) >= _BATCH:
                yield _flush(spans, context)
                spans = []
    if spans:
        yield _flush(spans, context)


def _flush(spans: list[dict[str, Any]], context: ContextCopies | None) -> pa.RecordBatch:
    if context is not None:
        context.saw(spans)
    return batch_of(spans)
