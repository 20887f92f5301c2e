"""Stored span columns -> OTLP `ExportTraceServiceRequest` bytes, without span objects.

Each column is turned into a list of per-span byte pieces in one pass (a dictionary
column encodes each distinct value once; ids and times go through one NumPy buffer), and
a span's `Span` message is the join of its pieces. Rows are then grouped into
`ResourceSpans` by the `resource` column and `ScopeSpans` by `scope`, as the SDK does.

Typed chip/link/op columns become the attributes they came from (`chip.id`, `link.type`,
`op.bytes`, ...); the `attributes` JSON column is restored with JSON's types (str, bool,
int, float, lists, maps); `events` and `links` JSON become OTLP events and links.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from chiptrace._protowire import field, key_value, key_values, length, varint
from chiptrace.schema import COLUMN_ATTRIBUTES

# Span fields (trace.proto): the tag bytes of each.
_T_TRACE_ID, _T_SPAN_ID, _T_PARENT, _T_NAME = b"\x0a", b"\x12", b"\x22", b"\x2a"
_T_KIND, _T_START, _T_END, _T_ATTR = b"\x30", b"\x39", b"\x41", b"\x4a"
_T_EVENT, _T_LINK, _T_STATUS, _T_FLAGS = b"\x5a", b"\x6a", b"\x7a", b"\x85\x01"
# Span.flags: W3C "sampled" plus bit 8, "the is-remote bit is known" (the parent is local).
_SPAN_FLAGS = 0x101
_LINK_FLAGS = b"\x35\x00\x01\x00\x00"  # Link.flags (fixed32) = 0x100: the linked span is local

_U64 = (1 << 64) - 1
_STRING_ATTRS = tuple(c for c in COLUMN_ATTRIBUTES if c not in ("op_bytes", "op_flops"))
_INT_ATTRS = ("op_bytes", "op_flops")

_FIXED = np.dtype(
    [
        ("t1", "u1"),
        ("l1", "u1"),
        ("trace_id", "V16"),
        ("t2", "u1"),
        ("l2", "u1"),
        ("span_id", "V8"),
        ("t7", "u1"),
        ("start", "<u8"),
        ("t8", "u1"),
        ("end", "<u8"),
        ("t16", "V2"),
        ("flags", "<u4"),
        ("t4", "u1"),
        ("l4", "u1"),
        ("parent", "V8"),  # last: cut off when there is no parent
    ]
)


@dataclass
class EncodedSpans:
    """Per-row `ScopeSpans.spans` fields (tag and length included) and their groups.

    Attributes:
        spans: one encoded span per row, ready to concatenate into a ScopeSpans.
        resource_index: per row, an index into `resources`.
        scope_index: per row, an index into `scopes`.
        resources: encoded `Resource` messages.
        scopes: encoded `InstrumentationScope` messages.
    """

    spans: list[bytes]
    resource_index: list[int]
    scope_index: list[int]
    resources: list[bytes]
    scopes: list[bytes]


def _column(batch: pa.RecordBatch | pa.Table, name: str) -> pa.Array:
    col = batch.column(name)
    return col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col


def _fixed_bytes(arr: pa.Array, width: int) -> np.ndarray:
    """An id column as an (n, width) uint8 array (null slots hold zeros)."""
    if arr.type != pa.binary(width):
        arr = arr.cast(pa.binary(width))
    if arr.null_count:
        arr = arr.fill_null(b"\0" * width)
    buf = arr.buffers()[1]
    raw = np.frombuffer(buf, dtype=np.uint8, count=(arr.offset + len(arr)) * width)
    return raw[arr.offset * width :].reshape(len(arr), width)


def _dict_pieces(arr: pa.Array, encode: Any) -> list[bytes]:
    """Per-row pieces of a string column: `encode` runs once per distinct value."""
    if not pa.types.is_dictionary(arr.type):
        arr = pc.dictionary_encode(arr)
    table = [encode(v) for v in arr.dictionary.to_pylist()]
    table.append(b"")  # index -1: null
    idx = arr.indices.fill_null(-1).to_numpy(zero_copy_only=False)
    return [table[i] for i in idx.tolist()]


def _fixed_pieces(batch: pa.RecordBatch | pa.Table) -> list[bytes]:
    """Ids, times and flags: fixed width, so built as one NumPy buffer and sliced per row.

    The parent id comes last in each record, so a root span's slice just stops before it.
    """
    n = batch.num_rows
    rec = np.zeros(n, dtype=_FIXED)
    rec["t1"], rec["l1"], rec["t2"], rec["l2"] = 0x0A, 16, 0x12, 8
    rec["t7"], rec["t8"], rec["t4"], rec["l4"] = 0x39, 0x41, 0x22, 8
    rec["t16"] = np.frombuffer(b"\x85\x01", dtype="V2")[0]
    rec["flags"] = _SPAN_FLAGS
    rec["trace_id"] = _fixed_bytes(_column(batch, "trace_id"), 16).view("V16").ravel()
    rec["span_id"] = _fixed_bytes(_column(batch, "span_id"), 8).view("V8").ravel()
    rec["start"] = _column(batch, "start_ns").to_numpy(zero_copy_only=False).view(np.uint64)
    rec["end"] = _column(batch, "end_ns").to_numpy(zero_copy_only=False).view(np.uint64)
    parent = _column(batch, "parent_span_id")
    rec["parent"] = _fixed_bytes(parent, 8).view("V8").ravel()
    buf = rec.tobytes()
    w = _FIXED.itemsize
    starts = np.arange(0, n * w, w, dtype=np.int64)
    ends = starts + w
    if parent.null_count:
        ends -= 10 * (~parent.is_valid().to_numpy(zero_copy_only=False))
    return [buf[a:b] for a, b in zip(starts.tolist(), ends.tolist(), strict=True)]


def _small_int_pieces(arr: pa.Array, tag_byte: bytes) -> list[bytes]:
    """An enum column (kind): one precomputed field per value, none for 0 (the default)."""
    table = {v: (tag_byte + varint(v) if v else b"") for v in pc.unique(arr).to_pylist()}
    table[None] = b""
    return [table[v] for v in arr.to_pylist()]


def _int_attr_pieces(arr: pa.Array, key: str) -> list[bytes]:
    """An int64 attribute column: each distinct value encodes once (op sizes repeat)."""
    prefix = field(b"\x0a", key.encode()) + b"\x12"
    if arr.null_count == len(arr):
        return [b""] * len(arr)
    values = arr.fill_null(0).to_numpy(zero_copy_only=False)
    uniq, inverse = np.unique(values, return_inverse=True)
    table = []
    for v in uniq.tolist():
        value = b"\x18" + varint(v)
        kv = prefix + length(len(value)) + value
        table.append(_T_ATTR + length(len(kv)) + kv)
    table.append(b"")
    if arr.null_count:
        inverse = np.where(arr.is_valid().to_numpy(zero_copy_only=False), inverse, len(uniq))
    return [table[i] for i in inverse.tolist()]


def _attr_field(key: str, value: Any) -> bytes:
    return field(_T_ATTR, key_value(key, value))


def _json_pieces(arr: pa.Array, encode: Any) -> list[bytes]:
    """A JSON text column: each distinct text (static attributes repeat) decodes once."""
    if arr.null_count == len(arr):
        return [b""] * len(arr)
    return _dict_pieces(arr, lambda text: encode(_loads(text)))


def _loads(text: str | None) -> Any:
    """JSON of a stored column; unreadable text (a hand-edited part) encodes as nothing."""
    try:
        return json.loads(text) if text else None
    except ValueError:
        return None


def _encode_attributes(attrs: Any) -> bytes:
    return key_values(attrs, _T_ATTR) if isinstance(attrs, dict) else b""


def _encode_events(events: Any) -> bytes:
    out = []
    for ev in events if isinstance(events, list) else ():
        if not isinstance(ev, dict):
            continue
        body = b"\x09" + (int(ev.get("time_ns") or 0) & _U64).to_bytes(8, "little")
        body += field(b"\x12", str(ev.get("name", "")).encode())
        body += key_values(ev.get("attributes") or {}, b"\x1a")
        out.append(field(_T_EVENT, body))
    return b"".join(out)


def _encode_links(links: Any) -> bytes:
    out = []
    for lk in links if isinstance(links, list) else ():
        if not isinstance(lk, dict):
            continue
        try:
            trace_id, span_id = bytes.fromhex(lk["trace_id"]), bytes.fromhex(lk["span_id"])
        except (KeyError, TypeError, ValueError):
            continue  # a link without hex ids cannot be expressed in OTLP
        body = field(b"\x0a", trace_id) + field(b"\x12", span_id)
        if lk.get("trace_state"):
            body += field(b"\x1a", str(lk["trace_state"]).encode())
        body += key_values(lk.get("attributes") or {}, b"\x22") + _LINK_FLAGS
        out.append(field(_T_LINK, body))
    return b"".join(out)


def _status_piece(code: int | None, msg: str | None) -> bytes:
    body = (field(b"\x12", msg.encode()) if msg else b"") + (
        b"\x18" + varint(code) if code else b""
    )
    return field(_T_STATUS, body)  # present even when empty, as the SDK does


def _status_pieces(batch: pa.RecordBatch | pa.Table) -> list[bytes]:
    codes = _column(batch, "status_code")
    messages = _column(batch, "status_message")
    if messages.null_count == len(messages):  # the usual case: a table per code
        table = {c: _status_piece(c, None) for c in pc.unique(codes).to_pylist()}
        return [table[c] for c in codes.to_pylist()]
    cache: dict[tuple[Any, Any], bytes] = {}
    out = []
    for key in zip(codes.to_pylist(), messages.to_pylist(), strict=True):
        piece = cache.get(key)
        if piece is None:
            piece = cache[key] = _status_piece(*key)
        out.append(piece)
    return out


def _group_index(arr: pa.Array, encode: Any) -> tuple[list[int], list[bytes]]:
    if not pa.types.is_dictionary(arr.type):
        arr = pc.dictionary_encode(arr)
    values = arr.dictionary.to_pylist()
    encoded = [encode(v) for v in values]
    idx = arr.indices.fill_null(len(encoded)).to_numpy(zero_copy_only=False).tolist()
    encoded.append(encode(None))
    return idx, encoded


def _resource(text: str | None) -> bytes:
    attrs = json.loads(text) if text else {}
    return key_values(attrs if isinstance(attrs, dict) else {}, b"\x0a")


def _scope(name: str | None) -> bytes:
    return field(b"\x0a", (name or "chiptrace").encode())


def encode_spans(batch: pa.RecordBatch | pa.Table) -> EncodedSpans:
    """Encode every row of a span batch (the store's schema, or DuckDB's plain-typed copy).

    Returns:
        The encoded spans and their resource and scope groups; see `requests`.
    """
    pieces: list[list[bytes]] = [
        _fixed_pieces(batch),
        _dict_pieces(_column(batch, "name"), lambda v: field(_T_NAME, v.encode())),
        _small_int_pieces(_column(batch, "kind"), _T_KIND),
        _status_pieces(batch),
    ]
    names = set(batch.schema.names)
    for col in _STRING_ATTRS:
        if col in names:
            key = COLUMN_ATTRIBUTES[col]
            pieces.append(_dict_pieces(_column(batch, col), lambda v, k=key: _attr_field(k, v)))
    for col in _INT_ATTRS:
        if col in names:
            pieces.append(_int_attr_pieces(_column(batch, col), COLUMN_ATTRIBUTES[col]))
    pieces.append(_json_pieces(_column(batch, "attributes"), _encode_attributes))
    pieces.append(_json_pieces(_column(batch, "events"), _encode_events))
    pieces.append(_json_pieces(_column(batch, "links"), _encode_links))
    bodies = list(map(b"".join, zip(*pieces, strict=True)))
    spans = [b"\x12" + length(len(b)) + b for b in bodies]
    res_idx, resources = _group_index(_column(batch, "resource"), _resource)
    scope_idx, scopes = _group_index(_column(batch, "scope"), _scope)
    return EncodedSpans(spans, res_idx, scope_idx, resources, scopes)


def _scope_spans(scope: bytes, spans: list[bytes]) -> bytes:
    return field(b"\x0a", scope) + b"".join(spans)


def _request(enc: EncodedSpans, lo: int, hi: int) -> bytes:
    """One ExportTraceServiceRequest for rows lo..hi, grouped by resource, then scope."""
    ri, si = enc.resource_index, enc.scope_index
    if len(set(ri[lo:hi])) == 1 and len(set(si[lo:hi])) == 1:
        groups: dict[int, dict[int, list[bytes]]] = {ri[lo]: {si[lo]: enc.spans[lo:hi]}}
    else:
        groups = {}
        for i in range(lo, hi):
            groups.setdefault(ri[i], {}).setdefault(si[i], []).append(enc.spans[i])
    out = []
    for r, by_scope in groups.items():
        body = field(b"\x0a", enc.resources[r])
        body += b"".join(
            field(b"\x12", _scope_spans(enc.scopes[s], sp)) for s, sp in by_scope.items()
        )
        out.append(field(b"\x0a", body))
    return b"".join(out)


def requests(enc: EncodedSpans, max_spans: int = 2048) -> Iterator[tuple[bytes, int]]:
    """Split encoded spans into requests of at most `max_spans` spans.

    Yields:
        (serialized ExportTraceServiceRequest, number of spans in it).
    """
    n = len(enc.spans)
    for lo in range(0, n, max_spans):
        hi = min(n, lo + max_spans)
        yield _request(enc, lo, hi), hi - lo


def encode_request(batch: pa.RecordBatch | pa.Table) -> bytes:
    """All rows of `batch` as one serialized ExportTraceServiceRequest."""
    enc = encode_spans(batch)
    return _request(enc, 0, len(enc.spans)) if enc.spans else b""
