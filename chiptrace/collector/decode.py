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
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from chiptrace.collector.wire import SpanReader, WireError
from chiptrace.errors import ChiptraceError
from chiptrace.schema import batch_from_columns, empty_batch, trace_ids_to_binary


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


def columns_to_batch(reader: SpanReader) -> Decoded:
    """The spans a SpanReader collected, as one batch of the store's schema."""
    c = reader.columns()
    n = len(c["span_id"])
    reason = (
        f"{reader.rejected} span(s) with a trace id not 16 bytes or a span id not 8"
        if reader.rejected
        else ""
    )
    if n == 0:
        return Decoded(empty_batch(), reader.rejected, reason)
    columns: dict[str, Any] = {}
    for name, values in c.items():
        first = values[0]
        # A column of one value (a process's service, an unused link column) costs n int32s.
        if isinstance(first, (str, type(None))) and values.count(first) == n:
            columns[name] = first
        else:
            columns[name] = values
    columns["trace_id"] = trace_ids_to_binary(c["trace_id"])
    columns["span_id"] = pa.FixedSizeBinaryArray.from_buffers(
        pa.binary(8), n, [None, pa.py_buffer(b"".join(c["span_id"]))]
    )
    columns["parent_span_id"] = pa.array(c["parent_span_id"], pa.binary(8))
    return Decoded(batch_from_columns(columns, n), reader.rejected, reason)


def request_to_batch(body: bytes) -> Decoded:
    """Decode serialized ExportTraceServiceRequest bytes into a span batch.

    Raises:
        DecodeError: malformed bytes.
    """
    reader = SpanReader()
    try:
        reader.read_request(body)
    except WireError as e:
        raise DecodeError(f"malformed OTLP protobuf body: {e}") from None
    return columns_to_batch(reader)


def decode(body: bytes, content_type: str = "application/x-protobuf") -> Decoded:
    """Decode a request body of `content_type` (protobuf or JSON) into a span batch.

    Raises:
        DecodeError: the body does not parse.
    """
    if "json" in content_type:
        body = parse_json(body).SerializeToString()
    return request_to_batch(body)
