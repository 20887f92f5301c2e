"""Jaeger JSON (`{"data": [traces]}` as the UI and the query API give it, or one bare trace)
-> span batches. Tags are typed attributes (chip.*, link.*, op.* to their columns),
CHILD_OF the parent, FOLLOWS_FROM links, logs events, the process the resource. Jaeger
keeps microseconds, so times come back to the microsecond."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pyarrow as pa

from chiptrace.importers.plan import FileFacts
from chiptrace.importers.source import TraceFormatError, read_all
from chiptrace.importers.spans import KIND_CODES, STATUS_CODES, columns_of
from chiptrace.schema import batch_from_columns, dumps, ids_to_binary, trace_ids_to_binary

_BATCH = 1 << 16


def _tags(tags: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for t in tags if isinstance(tags, list) else []:
        if isinstance(t, dict) and isinstance(t.get("key"), str):
            out[t["key"]] = t.get("value")
    return out


def _id(path: Path, value: Any, size: int, what: str) -> bytes:
    try:
        if isinstance(value, str) and 0 < len(value) <= size * 2:
            return bytes.fromhex(value.rjust(size * 2, "0"))
    except ValueError:
        pass
    raise TraceFormatError(f"{path}: {what}={value!r}: expected up to {size * 2} hex digits")


def _span(path: Path, sp: dict[str, Any], processes: dict[str, Any]) -> dict[str, Any]:
    for key in ("traceID", "spanID", "operationName", "startTime", "duration"):
        if key not in sp:
            raise TraceFormatError(f"{path}: a span without {key!r}; expected Jaeger JSON spans")
    trace = _id(path, sp["traceID"], 16, "traceID")
    attrs = _tags(sp.get("tags"))
    parent, links = None, []
    for ref in sp.get("references") or []:
        rid = _id(path, ref.get("spanID"), 8, "reference spanID")
        rtrace = _id(path, ref.get("traceID") or sp["traceID"], 16, "reference traceID")
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


def _batch(spans: list[dict[str, Any]]) -> pa.RecordBatch:
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


def read_jaeger(path: Path, facts: FileFacts) -> Iterator[pa.RecordBatch]:
    """Span batches of a Jaeger JSON file.

    Raises:
        TraceFormatError: not JSON, or not Jaeger's trace shape.
    """
    try:
        doc = msgspec.json.decode(read_all(path))
    except msgspec.DecodeError as e:
        raise TraceFormatError(f"{path}: malformed JSON ({e}); expected Jaeger JSON") from None
    traces = doc.get("data") if isinstance(doc, dict) and "data" in doc else [doc]
    if not isinstance(traces, list) or not all(isinstance(t, dict) for t in traces):
        raise TraceFormatError(f'{path}: expected Jaeger JSON: {{"data": [traces]}}')
    spans: list[dict[str, Any]] = []
    for tr in traces:
        if not isinstance(tr.get("spans"), list):
            raise TraceFormatError(f"{path}: a trace without a 'spans' list; expected Jaeger JSON")
        procs = tr.get("processes") if isinstance(tr.get("processes"), dict) else {}
        facts.events += len(tr["spans"])
        for sp in tr["spans"]:
            spans.append(_span(path, sp, procs))
            if len(spans) >= _BATCH:
                yield _batch(spans)
                spans = []
    if spans:
        yield _batch(spans)
    facts.categories = {"span": facts.events}
    facts.tally = {"skipped": {}}
