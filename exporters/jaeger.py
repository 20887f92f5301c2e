"""Jaeger JSON: the format the Jaeger UI loads from disk ("JSON File" upload) and its query
API returns: `{"data": [trace, ...]}`, times in microseconds, typed tags, processes.

Each trace lists its processes (`p1`, `p2`, ...: one per service and host, with the
resource attributes and `host.name` as tags), its spans with CHILD_OF references to their
parent and FOLLOWS_FROM references for their links, and events as logs, following the
mapping Jaeger's own OTLP translator uses (`span.kind`, `otel.status_code`, `error`,
`otel.scope.name` tags). `chiptrace.importers.jaeger.read_jaeger_json` reads such a file
back and checks it (the one Jaeger JSON reader; `chiptrace import` builds on it).
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from chiptrace import _attributes as A
from chiptrace.exporters.source import SpanSource
from chiptrace.exporters.textfile import TextSeries, write_series

log = logging.getLogger("chiptrace")


def tag(key: str, value: Any) -> dict[str, Any]:
    """A typed Jaeger tag; lists and maps become JSON strings, as Jaeger's translator does."""
    if isinstance(value, bool):
        return {"key": key, "type": "bool", "value": value}
    if isinstance(value, int):  # beyond 2^53 as a decimal string, as Jaeger writes int64s
        return {"key": key, "type": "int64", "value": A.json_safe(value)}
    if isinstance(value, float):  # NaN and infinities as "NaN", "Infinity", "-Infinity"
        return {"key": key, "type": "float64", "value": A.json_safe(value)}
    if isinstance(value, str):
        return {"key": key, "type": "string", "value": value}
    text = json.dumps(A.json_safe(value, big_ints=False), separators=(",", ":"), allow_nan=False)
    return {"key": key, "type": "string", "value": text}


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
    out = set(row.get("_left_out") or ())  # link targets the export does not hold
    for lk in A.links(row):
        if lk["span_id"].lower() not in out:
            refs.append(
                {"refType": "FOLLOWS_FROM", "traceID": lk["trace_id"], "spanID": lk["span_id"]}
            )
    return refs


LEFT_OUT_TAG = "chiptrace.links_left_out"  # span ids of links whose target is not in the file
CONTEXT_TAG = "chiptrace.context"  # a copy of an ancestor written in an earlier file


def _note_left_out(span: dict[str, Any], ids: list[str]) -> None:
    """A closed tree: the file holds every span a reference names; the links it cannot
    hold are dropped from the references and named in a tag instead."""
    if ids:
        span["tags"].append(tag(LEFT_OUT_TAG, ",".join(ids)))


# Links whose target span is not in the selection (a filter left it out, or the store
# never held it): their FOLLOWS_FROM references are dropped and noted (LEFT_OUT_TAG).
DANGLING_SQL = r"""
CREATE OR REPLACE TEMP TABLE chiptrace_dangling AS
WITH lk AS (
    SELECT trace_id, span_id, unnest(json_extract(links, '$[*]')) AS l FROM selected
    WHERE links IS NOT NULL AND json_valid(links) AND json_type(links) = 'ARRAY'
),
t AS (
    SELECT trace_id, span_id, lower(l ->> 'span_id') AS target,
           coalesce(TRY(from_hex(nullif(l ->> 'trace_id', ''))), trace_id) AS target_trace
    FROM lk WHERE regexp_full_match(coalesce(l ->> 'span_id', ''), '([0-9a-fA-F]{2})+')
)
SELECT trace_id, span_id, list(target) AS _left_out FROM t
WHERE NOT EXISTS (
    SELECT 1 FROM selected x WHERE x.trace_id = t.target_trace AND x.span_id = from_hex(t.target))
GROUP BY ALL
"""


def _process(row: dict[str, Any]) -> dict[str, Any]:
    res = A.resource(row)
    service = res.get("service.name") or row.get("service") or "chiptrace"
    tags = [tag(k, v) for k, v in res.items() if k != "service.name"]
    if row.get("host") and "host.name" not in res:
        tags.append(tag("host.name", row["host"]))
    return {"serviceName": str(service), "tags": tags}


def _span(row: dict[str, Any], trace_id: str, process_id: str) -> dict[str, Any]:
    start_us = row["start_ns"] // 1000
    span = {
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
    _note_left_out(span, list(row.get("_left_out") or ()))
    return span


_CHUNK = 1024  # spans encoded per json.dumps call, and between two size checks
_ROWS = 8192  # rows fetched from DuckDB and turned into dicts at a time
_GUESS_BYTES_PER_SPAN = 800  # until the file so far says better
DEFAULT_SPLIT_MB = 400.0  # the Jaeger UI fails on files past ~530 MB (a browser's string limit)


@dataclass
class JaegerExport:
    """What `write_jaeger_json` wrote: traces and spans, and the files (several when split)."""

    traces: int = 0
    spans: int = 0  # context copies (ancestors repeated in later pieces) included
    context: int = 0  # of which context copies
    files: list[Any] = field(default_factory=list)


class _TraceWriter:
    """Streams `{"data": [trace, ...]}` documents from spans sorted by trace: a trace's
    spans are written as they come, its processes when it ends. With a size limit, a
    trace that would not fit in the current file starts the next one, and a trace too
    big for any file is cut by time (its spans come in start order) into pieces, one per
    file, each a trace with the same id and its own processes."""

    def __init__(self, out: TextSeries, result: JaegerExport) -> None:
        self.out, self.result = out, result
        self.trace_id: str | None = None
        self.pids: dict[Any, str] = {}
        self.processes: dict[str, Any] = {}
        self.first_span = True
        self.file_traces = 0
        # A trace cut into pieces: each piece after the first carries the ancestors of its
        # spans as context copies (CONTEXT_TAG), so every piece is one tree in the UI.
        self._last_per_span = 0.0
        self.piece = 0
        self.in_piece: set[str] = set()  # span ids in this piece (pieces after the first)
        self.ancestors: dict[str, tuple[dict[str, Any], Any, dict[str, Any]]] = {}
        self.out.write('{"data":[')

    def add(self, rows: list[dict[str, Any]]) -> None:
        spans: list[dict[str, Any]] = []
        for row in rows:
            trace_id = A.hex_id(row["trace_id"])
            if trace_id != self.trace_id:
                self._write_spans(spans)
                spans = []
                self._close_trace()
                if self.file_traces and self.out.full(self._estimate(row.get("_n"))):
                    self._next_file()
                self._open_trace(trace_id)
            key = (row.get("service"), row.get("host"), row.get("resource"))
            span = _span(row, trace_id, self._pid(key, row))
            if self.piece:
                spans += self._context(span)
                self.in_piece.add(span["spanID"])
            if row.get("_parent"):
                self.ancestors[span["spanID"]] = (span, key, row)
            spans.append(span)
            if len(spans) >= self._chunk():
                self._write_spans(spans)
                spans = []
                if self.out.full():  # a trace too big for one file: cut it here
                    self._close_trace()
                    self._next_file()
                    self._open_trace(trace_id, piece=self.piece + 1)
        self._write_spans(spans)

    def _pid(self, key: Any, row: dict[str, Any]) -> str:
        pid = self.pids.get(key)
        if pid is None:
            pid = self.pids[key] = f"p{len(self.pids) + 1}"
            self.processes[pid] = _process(row)
        return pid

    def _context(self, span: dict[str, Any]) -> list[dict[str, Any]]:
        """Copies of the ancestors of `span` an earlier piece holds, root first; links to
        spans of this trace outside this piece are dropped and noted."""
        refs = span["references"]
        inside = [
            r
            for r in refs
            if r["refType"] == "CHILD_OF"
            or r["traceID"] != span["traceID"]
            or r["spanID"] in self.in_piece
        ]
        _note_left_out(span, [r["spanID"] for r in refs if r not in inside])
        span["references"] = inside
        chain: list[dict[str, Any]] = []
        parent = next((r["spanID"] for r in inside if r["refType"] == "CHILD_OF"), None)
        while parent is not None and parent not in self.in_piece and parent in self.ancestors:
            original, key, row = self.ancestors[parent]
            copy = {**original, "processID": self._pid(key, row)}
            copy["references"] = [r for r in original["references"] if r["refType"] == "CHILD_OF"]
            copy["tags"] = [*original["tags"], tag(CONTEXT_TAG, True)]
            chain.append(copy)
            self.in_piece.add(parent)
            parent = next((r["spanID"] for r in copy["references"]), None)
        return chain[::-1]

    def _per_span(self) -> float:
        """Bytes a span takes: the run's mean, or the last chunk's when spans grew (links,
        attributes), so a file is cut before it passes its limit."""
        mean = self.out.total / self.result.spans if self.result.spans else _GUESS_BYTES_PER_SPAN
        return max(mean, self._last_per_span)

    def _estimate(self, n_spans: Any) -> int:
        return int((n_spans or 0) * self._per_span())

    def _chunk(self) -> int:
        """Spans to encode before the next size check: fewer as the file nears its limit."""
        if self.out.limit is None:
            return _CHUNK
        # Half the room at a time: spans larger than the estimate (links, long
        # attributes) then pass the limit by a few spans, not by a whole chunk.
        room = (self.out.limit - self.out.size) / self._per_span() / 2
        return int(min(_CHUNK, max(16, room)))

    def _write_spans(self, spans: list[dict[str, Any]]) -> None:
        if not spans:
            return
        self.result.context += sum(1 for sp in spans if sp["tags"][-1]["key"] == CONTEXT_TAG)
        # allow_nan=False: a NaN that slipped past json_safe fails here, never in a browser
        text = json.dumps(spans, separators=(",", ":"), allow_nan=False)[1:-1]
        self._last_per_span = len(text) / len(spans)
        self.out.write(text if self.first_span else "," + text)
        self.first_span = False
        self.result.spans += len(spans)

    def _open_trace(self, trace_id: str, piece: int = 0) -> None:
        self.trace_id, self.pids, self.processes, self.first_span = trace_id, {}, {}, True
        self.piece, self.in_piece = piece, set()
        if not piece:
            self.ancestors = {}
        self.out.write(("," if self.file_traces else "") + f'{{"traceID":"{trace_id}","spans":[')
        self.file_traces += 1

    def _close_trace(self) -> None:
        if self.trace_id is None:
            return
        self.out.write(
            '],"processes":'
            + json.dumps(self.processes, separators=(",", ":"), allow_nan=False)
            + ',"warnings":null}'
        )
        self.trace_id = None

    def _next_file(self) -> None:
        self._end_file()
        self.out.close_file()
        self.out.open()
        self.out.write('{"data":[')

    def _end_file(self) -> None:
        self.result.traces += self.file_traces
        self.out.write(f'],"total":{self.file_traces},"limit":0,"offset":0,"errors":null}}')
        self.file_traces = 0

    def finish(self) -> None:
        self._close_trace()
        self._end_file()


def write_jaeger_json(
    spans: pa.Table | SpanSource,
    path: str | os.PathLike[str],
    split_mb: float | None = None,
) -> JaegerExport:
    """Write spans as Jaeger JSON (the query API's `{"data": [...]}` envelope), streamed in
    trace order.

    Args:
        spans: a table of spans_raw columns, or a SpanSource (trace dirs and filters).
        path: the file (written under a temporary name, renamed when complete), or `-`.
        split_mb: when the document would pass this many MB, write `NAME-001.json`,
            `NAME-002.json`, ... beside `path` instead, each a complete document that loads
            on its own: whole traces, and a trace too big for one file cut by time.
            None or 0: one file whatever its size.

    Returns:
        Traces and spans written (a trace cut in pieces counts once per piece), and the files.

    Raises:
        ChiptraceError: a file cannot be written.
    """
    source = spans if isinstance(spans, SpanSource) else SpanSource.of_table(spans)
    limit = int(split_mb * 1e6) if split_mb else None
    result = JaegerExport()
    # The span count of each trace rides along, so a trace that would not fit in the
    # current file can start the next one; without a limit it is not needed.
    count = ", count(*) OVER (PARTITION BY s.trace_id) AS _n" if limit else ""
    # Which spans are parents rides along too: a piece of a cut trace repeats them.
    parents = ", p.parent_span_id IS NOT NULL AS _parent" if limit else ""
    join = (
        " LEFT JOIN (SELECT DISTINCT trace_id, parent_span_id FROM selected"
        " WHERE parent_span_id IS NOT NULL) p"
        " ON p.trace_id = s.trace_id AND p.parent_span_id = s.span_id"
        if limit
        else ""
    )
    source.run(DANGLING_SQL)
    sql = (
        f"SELECT s.*, d._left_out{count}{parents} FROM selected s"
        " LEFT JOIN chiptrace_dangling d ON d.trace_id = s.trace_id AND d.span_id = s.span_id"
        f"{join} ORDER BY s.trace_id, s.start_ns, s.span_id"
    )

    def write(out: TextSeries) -> None:
        w = _TraceWriter(out, result)
        # 8,192 rows as Python dicts at a time (~60 MB; 65,536 took ~500 MB of the peak)
        for batch in source.stream(sql, _ROWS):
            w.add(batch.to_pylist())
        w.finish()

    result.files = write_series(path, limit, write)
    if len(result.files) > 1:
        log.warning(
            "chiptrace: the Jaeger JSON passes --split-mb %g (the Jaeger UI fails on files over "
            "about 530 MB): wrote %d files, %s to %s",
            split_mb,
            len(result.files),
            result.files[0].name,
            result.files[-1].name,
        )
    return result
