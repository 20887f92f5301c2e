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
from dataclasses import dataclass, field
from typing import Any, TextIO

import pyarrow as pa

from chiptrace.errors import ChiptraceError
from chiptrace.exporters import attributes as A
from chiptrace.exporters.source import SpanSource
from chiptrace.exporters.textfile import write_text

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
        refs.append(
            {"refType": "CHILD_OF", "traceID": trace_id, "spanID": A.hex_id(row["parent_span_id"])}
        )
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


class _TraceWriter:
    """Streams `{"data": [trace, ...]}` from spans sorted by trace: a trace's spans are
    written as they come, its processes when the next trace begins."""

    def __init__(self, fh: TextIO) -> None:
        self.fh = fh
        self.traces = 0
        self.trace_id: str | None = None
        self.pids: dict[Any, str] = {}
        self.processes: dict[str, Any] = {}
        self.first_span = True

    def add(self, rows: list[dict[str, Any]]) -> None:
        parts: list[str] = []
        spans: list[dict[str, Any]] = []
        for row in rows:
            trace_id = A.hex_id(row["trace_id"])
            if trace_id != self.trace_id:
                if spans:
                    parts.append(self._spans_text(spans))
                    spans = []
                parts.append(self._close_trace() + self._open_trace(trace_id))
            key = (row.get("service"), row.get("host"), row.get("resource"))
            pid = self.pids.get(key)
            if pid is None:
                pid = self.pids[key] = f"p{len(self.pids) + 1}"
                self.processes[pid] = _process(row)
            spans.append(_span(row, trace_id, pid))
        if spans:
            parts.append(self._spans_text(spans))
        self.fh.write("".join(parts))

    def _spans_text(self, spans: list[dict[str, Any]]) -> str:
        text = json.dumps(spans, separators=(",", ":"))[1:-1]  # one C call per run of spans
        if not self.first_span:
            text = "," + text
        self.first_span = False
        return text

    def _open_trace(self, trace_id: str) -> str:
        self.trace_id, self.pids, self.processes, self.first_span = trace_id, {}, {}, True
        self.traces += 1
        return ("," if self.traces > 1 else "") + f'{{"traceID":"{trace_id}","spans":['

    def _close_trace(self) -> str:
        if self.trace_id is None:
            return ""
        return (
            '],"processes":'
            + json.dumps(self.processes, separators=(",", ":"))
            + ',"warnings":null}'
        )

    def finish(self) -> None:
        self.fh.write(self._close_trace())


def write_jaeger_json(spans: pa.Table | SpanSource, path: str | os.PathLike[str]) -> int:
    """Write spans as a Jaeger JSON file (the query API's `{"data": [...]}` envelope),
    streamed in trace order; returns the number of traces written.

    Args:
        spans: a table of spans_raw columns, or a SpanSource (trace dirs and filters).
        path: the file (written under a temporary name, renamed when complete), or `-`.

    Raises:
        ChiptraceError: the file cannot be written.
    """
    source = spans if isinstance(spans, SpanSource) else SpanSource.of_table(spans)

    def write(fh: TextIO) -> None:
        fh.write('{"data":[')
        w = _TraceWriter(fh)
        for batch in source.stream("SELECT * FROM selected ORDER BY trace_id, start_ns, span_id"):
            w.add(batch.to_pylist())
        w.finish()
        fh.write(f'],"total":{w.traces},"limit":0,"offset":0,"errors":null}}')
        out.append(w.traces)

    out: list[int] = []
    write_text(path, write)
    return out[0]


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
            raise JaegerFormatError(
                f"{path}: {where}: startTime/duration must be integer microseconds"
            )
    for sp in tr["spans"]:
        for ref in sp.get("references") or []:
            _check_id(
                path,
                f"trace {tr['traceID']} span {sp['spanID']}",
                "reference spanID",
                ref.get("spanID"),
                16,
            )
            if (
                ref.get("refType") == "CHILD_OF"
                and ref.get("traceID") == tr["traceID"]
                and ref["spanID"] not in seen
            ):
                out.warnings.append(
                    f"trace {tr['traceID']} span {sp['spanID']}: parent {ref['spanID']} is missing"
                )
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
