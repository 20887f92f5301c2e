"""OTLP trace requests (protobuf or JSON) -> span RecordBatches of the store's schema.

The inverse of chiptrace.exporters.otlp_encode: `chip.*`, `link.*` and `op.*` attributes
whose values have the column's type go to their typed columns, every other attribute stays
in the `attributes` JSON column with its JSON type; events and links become the `events`
and `links` JSON columns; the resource's attributes the `resource` column (and `service`,
`host`, `pid` from `service.name`, `host.name`, `process.pid`).

Spans with ids of the wrong length are rejected and counted (OTLP partial success); a body
that does not parse raises `DecodeError`. OTLP/JSON ignores unknown fields, so a JSON object
without `resourceSpans` (a Chrome or Kineto trace posted by mistake) is a valid empty
request: it decodes to no spans and a `note` saying so, which the receiver sends back as a
partial-success message.
"""

from __future__ import annotations

import base64
import json
import re
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from chiptrace.collector.anyvalue import MAX_VALUE_DEPTH
from chiptrace.collector.anyvalue import decode_any_value as decode_any_value  # its old home
from chiptrace.collector.span_reader import SpanReader, WireError
from chiptrace.errors import ChiptraceError
from chiptrace.schema import batch_from_columns, empty_batch, trace_ids_to_binary


class DecodeError(ChiptraceError):
    """An OTLP request body that is not a valid ExportTraceServiceRequest."""


IMPORT_HINT = "load trace files with `chiptrace import FILE --out DIR`"
NO_SPANS_NOTE = (
    "the request held no spans (a JSON object without resourceSpans: a Chrome or Kineto "
    f"trace?); {IMPORT_HINT}"
)


@dataclass
class Decoded:
    """One request's spans, the spans it had to reject, and why.

    `reason` explains rejected spans; `note` is a warning about a request that was
    accepted but held nothing to store (OTLP partial success with no rejected spans).
    """

    batch: pa.RecordBatch
    rejected: int = 0
    reason: str = ""
    note: str = ""

    @property
    def message(self) -> str:
        """The partial-success error message, or "" when there is nothing to say."""
        return "; ".join(m for m in (self.reason, self.note) if m)


def _hex_to_b64(obj: dict[str, Any], *keys: str) -> None:
    for key in keys:
        value = obj.get(key)
        if isinstance(value, str) and value:
            try:
                obj[key] = base64.b64encode(bytes.fromhex(value)).decode()
            except ValueError:
                raise DecodeError(f"OTLP/JSON {key}={value!r}: expected hex") from None


def parse_json(body: bytes) -> tuple[ExportTraceServiceRequest, str]:
    """Parse an OTLP/JSON trace request (ids in hex, as the OTLP specification says).

    Returns:
        The request, and a note when the body was a JSON object with other fields but no
        `resourceSpans` (a valid, empty request that was probably meant for `import`).

    Raises:
        DecodeError: not JSON, nested too deep, or not the OTLP trace shape.
    """
    try:
        doc = json.loads(body)
    except RecursionError:
        raise DecodeError("malformed OTLP/JSON body: nested too deep") from None
    except ValueError as e:
        raise DecodeError(f"malformed OTLP/JSON body: {e}") from None
    if not isinstance(doc, dict):
        raise DecodeError(
            f"malformed OTLP/JSON body: expected an object with resourceSpans, got a JSON "
            f"{type(doc).__name__}; {IMPORT_HINT}"
        )
    note = NO_SPANS_NOTE if doc and "resourceSpans" not in doc else ""
    try:
        for rs in doc.get("resourceSpans") or []:
            for ss in rs.get("scopeSpans") or []:
                for sp in ss.get("spans") or []:
                    _hex_to_b64(sp, "traceId", "spanId", "parentSpanId")
                    for lk in sp.get("links") or []:
                        _hex_to_b64(lk, "traceId", "spanId")
        request = json_format.ParseDict(
            doc, ExportTraceServiceRequest(), ignore_unknown_fields=True
        )
    except DecodeError:
        raise
    except RecursionError:
        raise DecodeError("malformed OTLP/JSON body: nested too deep") from None
    except (ValueError, TypeError, AttributeError, json_format.ParseError) as e:
        raise DecodeError(f"malformed OTLP/JSON body: {_short(e)}") from None
    return request, note


_FIELD_CHAIN = re.compile(r"Failed to parse (\w+) field: ")


def _short(error: Exception) -> str:
    """json_format's message without its `Failed to parse X field: ` chain (one per level)."""
    text = str(error).splitlines()[0] if str(error) else type(error).__name__
    path = ".".join(_FIELD_CHAIN.findall(text))
    text = _FIELD_CHAIN.sub("", text)
    if "too deep" in text:
        text = "nested too deep"
    if len(path) > 120:
        path = path[:60] + "..." + path[-40:]
    return f"{path}: {text}" if path else text


def columns_to_batch(reader: SpanReader) -> Decoded:
    """The spans a SpanReader collected, as one batch of the store's schema."""
    c = reader.columns()
    n = len(c["span_id"])
    reasons = []
    if reader.rejected:
        reasons.append(f"{reader.rejected} span(s) with a trace id not 16 bytes or a span id not 8")
    if reader.bad_spans:
        reasons.append(f"{reader.bad_spans} span(s) with events or links that do not parse")
    if reader.truncated:
        reasons.append(
            f"{reader.truncated} attribute value(s) nested deeper than {MAX_VALUE_DEPTH} "
            "levels cut there"
        )
    reason = "; ".join(reasons)
    rejected = reader.rejected + reader.bad_spans
    if n == 0:
        return Decoded(empty_batch(), rejected, reason)
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
    return Decoded(batch_from_columns(columns, n), rejected, reason)


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
    note = ""
    if "json" in content_type:
        request, note = parse_json(body)
        try:
            body = request.SerializeToString()
        except RecursionError:  # nesting deeper than json.loads minded but protobuf does
            raise DecodeError("malformed OTLP/JSON body: nested too deep") from None
    decoded = request_to_batch(body)
    decoded.note = note
    return decoded
