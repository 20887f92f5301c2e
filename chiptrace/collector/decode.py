"""OTLP trace requests (protobuf or JSON) -> span RecordBatches of the store's schema.

The inverse of chiptrace.exporters.otlp_encode: `chip.*`, `link.*` and `op.*` attributes
whose values have the column's type go to their typed columns, every other attribute stays
in the `attributes` JSON column with its JSON type; events and links become the `events`
and `links` JSON columns; the resource's attributes the `resource` column (and `service`,
`host`, `pid` from `service.name`, `host.name`, `process.pid`).

Spans with ids of the wrong length are rejected and counted (OTLP partial success); a body
that does not parse raises `DecodeError`.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from google.protobuf import json_format
from google.protobuf.message import DecodeError as _ProtoDecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from chiptrace.errors import ChiptraceError
from chiptrace.schema import ATTRIBUTE_COLUMNS, batch_from_columns, dumps, empty_batch

_INT_COLUMNS = frozenset({"op_bytes", "op_flops"})
_COLUMNS = tuple(ATTRIBUTE_COLUMNS.values())


class DecodeError(ChiptraceError):
    """An OTLP request body that is not a valid ExportTraceServiceRequest."""


@dataclass
class Decoded:
    """One request's spans, and the spans it had to reject."""

    batch: pa.RecordBatch
    rejected: int = 0
    reason: str = ""


def decode_any_value(value: Any) -> Any:
    """The Python value of an opentelemetry-proto `AnyValue` (None when unset)."""
    which = value.WhichOneof("value")
    if which is None:
        return None
    if which == "array_value":
        return [decode_any_value(v) for v in value.array_value.values]
    if which == "kvlist_value":
        return {kv.key: decode_any_value(kv.value) for kv in value.kvlist_value.values}
    if which == "bytes_value":
        return base64.b64encode(value.bytes_value).decode()  # JSON has no bytes
    return getattr(value, which)


def key_values(kvs: Any) -> dict[str, Any]:
    """A repeated KeyValue field as a dict."""
    return {kv.key: decode_any_value(kv.value) for kv in kvs}


def parse_protobuf(body: bytes) -> ExportTraceServiceRequest:
    """Parse a binary OTLP trace request.

    Raises:
        DecodeError: the bytes are not an ExportTraceServiceRequest.
    """
    try:
        return ExportTraceServiceRequest.FromString(body)
    except (_ProtoDecodeError, RuntimeError, ValueError) as e:
        raise DecodeError(f"malformed OTLP protobuf body: {e}") from None


def _hex_to_b64(obj: dict[str, Any], *keys: str) -> None:
    for key in keys:
        value = obj.get(key)
        if isinstance(value, str) and value:
            try:
                obj[key] = base64.b64encode(bytes.fromhex(value)).decode()
            except ValueError:
                raise DecodeError(f"OTLP/JSON {key}={value!r}: expected hex") from None


def parse_json(body: bytes) -> ExportTraceServiceRequest:
    """Parse an OTLP/JSON trace request (ids in hex, as the OTLP specification says).

    Raises:
        DecodeError: not JSON, or not the OTLP trace shape.
    """
    try:
        doc = json.loads(body)
        for rs in doc.get("resourceSpans") or []:
            for ss in rs.get("scopeSpans") or []:
                for sp in ss.get("spans") or []:
                    _hex_to_b64(sp, "traceId", "spanId", "parentSpanId")
                    for lk in sp.get("links") or []:
                        _hex_to_b64(lk, "traceId", "spanId")
        return json_format.ParseDict(doc, ExportTraceServiceRequest(), ignore_unknown_fields=True)
    except DecodeError:
        raise
    except (ValueError, TypeError, AttributeError, json_format.ParseError) as e:
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise DecodeError(f"malformed OTLP/JSON body: {first}") from None


class _Columns:
    """Per-column lists for one request."""

    def __init__(self) -> None:
        self.lists: dict[str, list[Any]] = {
            name: [] for name in (
                "trace_id", "span_id", "parent_span_id", "name", "kind", "start_ns", "end_ns",
                "status_code", "status_message", "service", "host", "pid", "scope", "resource",
                "attributes", "events", "links", *_COLUMNS,
            )
        }  # fmt: skip

    def add_span(self, sp: Any, res: tuple[str, str | None, int | None, str], scope: str) -> None:
        c = self.lists
        c["trace_id"].append(sp.trace_id)
        c["span_id"].append(sp.span_id)
        c["parent_span_id"].append(sp.parent_span_id or None)
        c["name"].append(sp.name)
        c["kind"].append(sp.kind)
        c["start_ns"].append(sp.start_time_unix_nano)
        c["end_ns"].append(sp.end_time_unix_nano)
        c["status_code"].append(sp.status.code)
        c["status_message"].append(sp.status.message or None)
        c["service"].append(res[0])
        c["host"].append(res[1])
        c["pid"].append(res[2])
        c["resource"].append(res[3])
        c["scope"].append(scope)
        typed = dict.fromkeys(_COLUMNS)
        rest = {}
        for kv in sp.attributes:
            value = decode_any_value(kv.value)
            col = ATTRIBUTE_COLUMNS.get(kv.key)
            if col is not None and _fits(col, value):
                typed[col] = value
            else:
                rest[kv.key] = value
        for col, value in typed.items():
            c[col].append(value)
        c["attributes"].append(dumps(rest) if rest else None)
        c["events"].append(_events(sp.events) if sp.events else None)
        c["links"].append(_links(sp.links) if sp.links else None)


def _fits(col: str, value: Any) -> bool:
    if col in _INT_COLUMNS:
        return isinstance(value, int) and not isinstance(value, bool) and -(2**63) <= value < 2**63
    return isinstance(value, str)


def _events(events: Any) -> str:
    return dumps([{"name": e.name, "time_ns": e.time_unix_nano, "attributes": key_values(e.attributes)}
                  for e in events])  # fmt: skip


def _links(links: Any) -> str:
    return dumps([{"trace_id": lk.trace_id.hex(), "span_id": lk.span_id.hex(),
                   "attributes": key_values(lk.attributes)} for lk in links])  # fmt: skip


def _resource(rs: Any) -> tuple[str, str | None, int | None, str]:
    attrs = key_values(rs.resource.attributes)
    pid = attrs.get("process.pid")
    host = attrs.get("host.name")
    return (
        str(attrs.get("service.name") or "unknown_service"),
        str(host) if host is not None else None,
        pid if isinstance(pid, int) and -(2**31) <= pid < 2**31 else None,
        dumps(attrs),
    )


def request_to_batch(req: ExportTraceServiceRequest) -> Decoded:
    """Columns of every well-formed span in `req` (16-byte trace id, 8-byte span id)."""
    cols = _Columns()
    rejected = 0
    for rs in req.resource_spans:
        res = _resource(rs)
        for ss in rs.scope_spans:
            scope = ss.scope.name or "unknown"
            for sp in ss.spans:
                if len(sp.trace_id) != 16 or len(sp.span_id) != 8 or len(sp.parent_span_id) not in (0, 8):
                    rejected += 1
                    continue
                cols.add_span(sp, res, scope)
    reason = f"{rejected} span(s) with a trace id not 16 bytes or a span id not 8" if rejected else ""
    n = len(cols.lists["span_id"])
    if n == 0:
        return Decoded(empty_batch(), rejected, reason)
    c = cols.lists
    columns: dict[str, Any] = dict(c)
    columns["trace_id"] = pa.array(c["trace_id"], pa.binary(16))
    columns["span_id"] = pa.array(c["span_id"], pa.binary(8))
    columns["parent_span_id"] = pa.array(c["parent_span_id"], pa.binary(8))
    return Decoded(batch_from_columns(columns, n), rejected, reason)


def decode(body: bytes, content_type: str = "application/x-protobuf") -> Decoded:
    """Decode a request body of `content_type` (protobuf or JSON) into a span batch.

    Raises:
        DecodeError: the body does not parse.
    """
    req = parse_json(body) if "json" in content_type else parse_protobuf(body)
    return request_to_batch(req)
