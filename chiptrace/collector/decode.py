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
from chiptrace.collector.fastscope import DICT_COLUMNS
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


_SURROGATE = re.compile("[\ud800-\udfff]")


def replaced_text(body: bytes) -> tuple[str, int]:
    """A JSON body as text, invalid UTF-8 replaced with U+FFFD; and how many sequences were
    replaced (a bad byte in one string costs that string's byte, not the request)."""
    try:
        return body.decode("utf-8"), 0
    except UnicodeDecodeError:
        text = body.decode("utf-8", "replace")
        return text, text.count("\ufffd") - body.count("\ufffd".encode())


def replace_surrogates(doc: Any) -> int:
    """Replace unpaired surrogates (`"\\ud800"` escapes: JSON allows them, UTF-8 and
    protobuf do not) with U+FFFD in every string of `doc`, in place; how many strings.
    Iterative: the document may nest as deep as json.loads allowed."""
    count = 0
    stack = [doc]
    while stack:
        node = stack.pop()
        items: Any = node.items() if isinstance(node, dict) else enumerate(node)
        fixes: list[tuple[Any, str | None]] = []
        for key, value in items:
            if isinstance(value, (dict, list)):
                stack.append(value)
            elif isinstance(value, str) and _SURROGATE.search(value):
                fixes.append((key, _SURROGATE.sub("\ufffd", value)))
            if isinstance(key, str) and _SURROGATE.search(key):
                fixes.append((key, None))
        for key, value in fixes:
            if value is None:  # a key: renamed, its value kept
                node[_SURROGATE.sub("\ufffd", key)] = node.pop(key)
            else:
                node[key] = value
            count += 1
    return count


def parse_json(body: bytes) -> tuple[ExportTraceServiceRequest, str, int]:
    """Parse an OTLP/JSON trace request (ids in hex, as the OTLP specification says).

    Returns:
        The request; a note when the body was a JSON object with other fields but no
        `resourceSpans` (a valid, empty request that was probably meant for `import`); and
        how many invalid UTF-8 sequences and unpaired surrogates were replaced with U+FFFD.

    Raises:
        DecodeError: not JSON, nested too deep, or not the OTLP trace shape.
    """
    text, replaced = replaced_text(body)
    try:
        doc = json.loads(text)
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
        try:
            request = json_format.ParseDict(
                doc, ExportTraceServiceRequest(), ignore_unknown_fields=True
            )
        except json_format.ParseError as e:
            if "surrogate" not in str(e) or not (fixed := replace_surrogates(doc)):
                raise
            replaced += fixed
            request = json_format.ParseDict(
                doc, ExportTraceServiceRequest(), ignore_unknown_fields=True
            )
    except DecodeError:
        raise
    except RecursionError:
        raise DecodeError("malformed OTLP/JSON body: nested too deep") from None
    except (ValueError, TypeError, AttributeError, json_format.ParseError) as e:
        raise DecodeError(f"malformed OTLP/JSON body: {_short(e)}") from None
    return request, note, replaced


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
    if reader.replaced:
        reasons.append(f"{reader.replaced} string(s) with invalid UTF-8 stored with U+FFFD")
    reason = "; ".join(reasons)
    rejected = reader.rejected + reader.bad_spans
    batches = list(reader.batches)
    if n:
        batches.append(_rows_batch(c, n))
    if not batches:
        return Decoded(empty_batch(), rejected, reason)
    if len(batches) == 1:
        return Decoded(batches[0], rejected, reason)
    # Scopes read whole and spans read one by one: one batch (its dictionaries unified).
    table = pa.Table.from_batches(batches).combine_chunks()
    return Decoded(table.to_batches()[0], rejected, reason)


def _rows_batch(c: dict[str, list[Any]], n: int) -> pa.RecordBatch:
    columns: dict[str, Any] = {}
    for name, values in c.items():
        first = values[0]
        # A column of one value (a process's service, an unused link column) costs n int32s.
        if (first is None or (isinstance(first, str) and name in DICT_COLUMNS)) and values.count(
            first
        ) == n:
            columns[name] = first
        else:
            columns[name] = values
    columns["trace_id"] = trace_ids_to_binary(c["trace_id"])
    columns["span_id"] = pa.FixedSizeBinaryArray.from_buffers(
        pa.binary(8), n, [None, pa.py_buffer(b"".join(c["span_id"]))]
    )
    columns["parent_span_id"] = pa.array(c["parent_span_id"], pa.binary(8))
    return batch_from_columns(columns, n)


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
    note, replaced = "", 0
    if "json" in content_type:
        request, note, replaced = parse_json(body)
        try:
            body = request.SerializeToString()
        except RecursionError:  # nesting deeper than json.loads minded but protobuf does
            raise DecodeError("malformed OTLP/JSON body: nested too deep") from None
    decoded = request_to_batch(body)
    decoded.note = note
    if replaced:
        text = f"{replaced} invalid UTF-8 sequence(s) or unpaired surrogate(s) replaced with U+FFFD"
        decoded.reason = "; ".join(r for r in (decoded.reason, text) if r)
    return decoded
