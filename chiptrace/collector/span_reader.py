"""A lean reader of OTLP `ExportTraceServiceRequest` bytes, span fields straight to columns.

opentelemetry-proto's parser is C, but every field read from Python through its objects
costs about half a microsecond, ~15 us a span in all. This reader walks the wire format
itself (chiptrace._protowire, chiptrace.collector._span_scan) and touches each span's bytes once. What repeats is
decoded once, through caches keyed by the raw bytes and shared across requests: a
`KeyValue` (`chip.id = gpu:3`), a status, and a span's whole set of generic attributes as
JSON. What is rare (events, links, a value seen for the first time) goes through
opentelemetry-proto's classes.

`chip.type` is one of the six chip types or it stays a generic attribute; a span with a
`chip.id` and no `chip.type` gets the type its id names (`schema.chip_type_of`).
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
from google.protobuf.message import DecodeError as ProtoDecodeError
from opentelemetry.proto.common.v1.common_pb2 import InstrumentationScope, KeyValue
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from opentelemetry.proto.trace.v1.trace_pb2 import Status

from chiptrace._protowire import WireError, fields
from chiptrace.collector._span_scan import scan_span, scope_fields, span_header
from chiptrace.collector.anyvalue import (
    RawValueReader,
    decode_any_value,
    events_json,
    key_values,
    links_json,
    resource_row,
)
from chiptrace.collector.fastscope import MIN_SPANS, scope_batch
from chiptrace.schema import ATTRIBUTE_COLUMNS, CHIP_TYPES, chip_type_of, dumps

_HAS_CORE = object()  # a span tail holding ids, name, kind or times: not the fast shape
_INT_COLUMNS = frozenset({"op_bytes", "op_flops"})
TYPED_COLUMNS = tuple(ATTRIBUTE_COLUMNS.values())
_COL_INDEX = {c: i for i, c in enumerate(TYPED_COLUMNS)}
_NO_TYPED = (None,) * len(TYPED_COLUMNS)
_CHIP_ID = _COL_INDEX["chip_id"]
_CHIP_TYPE = _COL_INDEX["chip_type"]
# Values above this are decoded every time, never cached: a unique 10 MB attribute would
# otherwise sit in three caches (raw key, decoded value, JSON) until the cache empties.
MAX_CACHED_BYTES = 4096
DEFAULT_CACHE_BYTES = 32 << 20
_ENTRY_OVERHEAD = 200  # dict slot, key and value objects: bytes an entry costs beyond its key
SPAN_COLUMNS = (
    "trace_id",
    "span_id",
    "parent_span_id",
    "name",
    "kind",
    "start_ns",
    "end_ns",
    "status_code",
    "status_message",
    "service",
    "host",
    "pid",
    "scope",
    "resource",
    "attributes",
    "events",
    "links",
    *TYPED_COLUMNS,
)


def _fits(col: str, value: Any) -> bool:
    if col in _INT_COLUMNS:
        return isinstance(value, int) and not isinstance(value, bool) and -(2**63) <= value < 2**63
    if col == "chip_type":
        return value in CHIP_TYPES
    return isinstance(value, str)


class Caches:
    """Decoded values keyed by their raw bytes, shared by the readers of one receiver.

    A dict lookup is thread-safe under the GIL, and a lost race only decodes twice. Bounded
    twice over: a value whose raw bytes exceed MAX_CACHED_BYTES is not kept, and each dict
    is emptied when it reaches `limit` entries or its share of `max_bytes`, so unique
    values cannot grow it forever.
    """

    def __init__(self, limit: int = 50_000, max_bytes: int = DEFAULT_CACHE_BYTES) -> None:
        self.limit = limit
        self.kv: dict[bytes, tuple[int | None, str, Any]] = {}
        self.attrs: dict[tuple[bytes, ...], tuple[tuple[Any, ...], str | None]] = {}
        self.tails: dict[bytes, Any] = {}
        self.status: dict[bytes, tuple[int, str | None]] = {}
        tables = (self.kv, self.attrs, self.tails, self.status)
        self._share = max(max_bytes // len(tables), 1)
        self._bytes = {id(t): 0 for t in tables}

    def put(self, table: dict[Any, Any], key: Any, value: Any, size: int) -> Any:
        """Keep `value` under `key` when `size` (the raw bytes it was decoded from) is small."""
        if size > MAX_CACHED_BYTES:
            return value
        # Decoded values are about as large as their raw bytes: count both.
        cost = 2 * size + _ENTRY_OVERHEAD
        used = self._bytes[id(table)] + cost
        if len(table) >= self.limit or used > self._share:
            table.clear()
            used = cost
        self._bytes[id(table)] = used
        table[key] = value
        return value

    @property
    def nbytes(self) -> int:
        """Bytes the caches hold, estimated as they are filled."""
        return sum(self._bytes.values())


SHARED_CACHES = Caches()


class SpanReader:
    """Reads the spans of one or more requests into rows (see `columns`).

    Args:
        caches: decoded-value caches; by default one shared by every reader in the process.
    """

    def __init__(self, caches: Caches | None = None) -> None:
        self.rows: list[tuple[Any, ...]] = []
        self.batches: list[pa.RecordBatch] = []  # scopes read whole (fastscope)
        self.rejected = 0  # spans with ids of the wrong length
        self.bad_spans = 0  # spans whose events or links do not parse
        self.truncated = 0  # attribute values cut at MAX_VALUE_DEPTH
        self.replaced = 0  # strings with invalid UTF-8 stored with U+FFFD (names aside)
        c = caches or SHARED_CACHES
        self._caches = c
        self._kv, self._attrs, self._tails, self._status = c.kv, c.attrs, c.tails, c.status

    # ------------------------------------------------------------ caches (decoded on miss)

    def _key_value(self, raw: bytes) -> tuple[int | None, str, Any]:
        try:
            kv = KeyValue.FromString(raw)
            key, value = kv.key, decode_any_value(kv.value)
        except (ProtoDecodeError, RecursionError):
            # Invalid UTF-8 or nesting past protobuf's limit: the value, repaired, costs
            # nothing else (it used to fail the request). Not cached: each use counts.
            reader = RawValueReader()
            key, value = reader.key_value(raw, 0, len(raw))
            self._count(reader)
            col = ATTRIBUTE_COLUMNS.get(key)
            return (_COL_INDEX[col] if col is not None and _fits(col, value) else None, key, value)
        col = ATTRIBUTE_COLUMNS.get(key)
        hit = (_COL_INDEX[col] if col is not None and _fits(col, value) else None, key, value)
        return self._caches.put(self._kv, raw, hit, len(raw))

    def _count(self, reader: RawValueReader) -> None:
        self.truncated += reader.truncated
        self.replaced += reader.replaced

    def _resource(self, raw: bytes) -> tuple[str, str | None, int | None, str]:
        """A Resource message as (service, host, pid, attributes JSON); one with invalid
        UTF-8 or nesting past protobuf's limit is read by hand (it used to fail the
        request)."""
        try:
            attrs = key_values(Resource.FromString(raw).attributes)
        except (ProtoDecodeError, RecursionError):
            reader = RawValueReader()
            attrs = reader.key_values(raw, 0, len(raw), 1)  # Resource.attributes = 1
            self._count(reader)
        return resource_row(attrs)

    def _scope_name(self, raw: bytes) -> str:
        """An InstrumentationScope's name (the rest is not stored), repaired as above."""
        try:
            return InstrumentationScope.FromString(raw).name or "unknown"
        except (ProtoDecodeError, RecursionError):
            reader = RawValueReader()
            name = ""
            for num, wt, v in fields(raw, 0, len(raw)):
                if num == 1 and wt == 2:  # InstrumentationScope.name = 1
                    name = reader.text(raw[v[0] : v[1]])
            self._count(reader)
            return name or "unknown"

    def status_of(self, raw: bytes) -> tuple[int, str | None]:
        """(code, message) of a Status message's bytes, cached."""
        hit = self._status.get(raw)
        if hit is None:
            st = Status.FromString(raw)
            hit = self._caches.put(
                self._status, raw, (st.code if st.code < 128 else 0, st.message or None), len(raw)
            )
        return hit

    # ------------------------------------------------------------ messages

    def read_request(self, buf: bytes) -> None:
        """Append every span of a serialized ExportTraceServiceRequest.

        Raises:
            WireError: malformed bytes (nothing of this request is kept then).
        """
        before = len(self.rows), len(self.batches)
        try:
            for num, wt, v in fields(buf, 0, len(buf)):
                if num == 1 and wt == 2:
                    self._resource_spans(buf, *v)
        except (IndexError, ValueError, RuntimeError, ProtoDecodeError) as e:
            self._truncate(before)
            raise WireError(f"malformed protobuf: {e}") from None
        except WireError:
            self._truncate(before)
            raise

    def _truncate(self, n: tuple[int, int]) -> None:
        del self.rows[n[0] :]
        del self.batches[n[1] :]

    def _resource_spans(self, buf: bytes, lo: int, hi: int) -> None:
        res: tuple[str, str | None, int | None, str] = ("unknown_service", None, None, "{}")
        scopes = []
        for num, wt, v in fields(buf, lo, hi):
            if num == 1 and wt == 2:
                res = self._resource(buf[v[0] : v[1]])
            elif num == 2 and wt == 2:
                scopes.append(v)
        for s_lo, s_hi in scopes:  # the resource may come after its spans on the wire
            self._scope_spans(buf, s_lo, s_hi, res)

    def _scope_spans(self, buf: bytes, lo: int, hi: int, res: tuple[Any, ...]) -> None:
        at, spans = scope_fields(buf, lo, hi)
        scope = self._scope_name(buf[at[0] : at[1]]) if at is not None else "unknown"
        if len(spans) >= MIN_SPANS:
            batch = scope_batch(buf, spans, self._tail_info, res, scope, MAX_CACHED_BYTES)
            if batch is not None:
                self.batches.append(batch)
                return
        for s_lo, s_hi in spans:
            self._span(buf, s_lo, s_hi, res, scope)

    def _tail_info(self, tail: bytes) -> tuple[Any, ...] | None:
        """A tail's decoded (typed, rest, status, events, links); None: not the fast shape."""
        try:
            info = self._tails.get(tail) or self._tail(tail)
        except (ProtoDecodeError, RecursionError):
            return None  # events or links that do not parse: span by span, costing that span
        return None if info is _HAS_CORE else info

    def _span(self, buf: bytes, lo: int, hi: int, res: tuple[Any, ...], scope: str) -> None:
        """One Span message; one whose events or links do not parse costs itself alone."""
        try:
            self._span_row(buf, lo, hi, res, scope)
        except (ProtoDecodeError, RecursionError):
            self.bad_spans += 1

    def _span_row(self, buf: bytes, lo: int, hi: int, res: tuple[Any, ...], scope: str) -> None:
        """One Span message.

        Fast path: SDKs write a span's fields in field-number order, so ids, name, kind and
        times sit at the front at known tags; the rest of the span (attributes, status,
        flags) often repeats byte for byte between spans and is decoded once per request.
        Anything else takes the field-by-field scan.
        """
        head = span_header(buf, lo, hi)
        if head is not None and hi - head[7] <= MAX_CACHED_BYTES:  # a large tail: not cached
            trace_id, span_id, parent, name, kind, start, end, i = head
            tail = buf[i:hi]
            info = self._tails.get(tail) or self._tail(tail)
            if info is not _HAS_CORE:
                typed, rest, status, events, links = info
                self.rows.append(
                    (
                        trace_id,
                        span_id,
                        parent,
                        name,
                        kind,
                        start,
                        end,
                        status[0],
                        status[1],
                        res,
                        scope,
                        typed,
                        rest,
                        events,
                        links,
                    )
                )
                return
        sc = scan_span(buf, lo, hi, self)
        trace_id, span_id, parent = sc[0], sc[1], sc[2]
        if len(trace_id) != 16 or len(span_id) != 8 or len(parent) not in (0, 8):
            self.rejected += 1
            return
        typed, rest, status, events, links = self._resolve(sc)
        self.rows.append(
            (
                trace_id,
                span_id,
                parent or None,
                sc[3],
                sc[4],
                sc[5],
                sc[6],
                status[0],
                status[1],
                res,
                scope,
                typed,
                rest,
                events,
                links,
            )
        )

    def _tail(self, tail: bytes) -> Any:
        sc = scan_span(tail, 0, len(tail), self)
        if sc[11]:
            info: Any = _HAS_CORE
        else:
            info = self._resolve(sc)
        if not (sc[9] or sc[10]):  # events carry times: unique, not worth keeping
            self._caches.put(self._tails, tail, info, len(tail))
        return info

    def _resolve(self, sc: list[Any]) -> tuple[Any, ...]:
        key = tuple(sc[8])
        typed, rest = self._attrs.get(key) or self._attributes(key)
        return (
            typed,
            rest,
            sc[7],
            events_json(sc[9]) if sc[9] else None,
            links_json(sc[10]) if sc[10] else None,
        )

    def _attributes(self, raws: tuple[bytes, ...]) -> tuple[tuple[Any, ...], str | None]:
        """(typed column values in TYPED_COLUMNS order, JSON of the rest) of one span."""
        typed: list[Any] = list(_NO_TYPED)
        rest: dict[str, Any] | None = None
        get = self._kv.get
        for raw in raws:
            idx, key, value = get(raw) or self._key_value(raw)
            if idx is None:
                if rest is None:
                    rest = {}
                rest[key] = value
            else:
                typed[idx] = value
        if typed[_CHIP_TYPE] is None and not (rest and "chip.type" in rest):
            typed[_CHIP_TYPE] = chip_type_of(typed[_CHIP_ID])
        size = sum(len(r) for r in raws)
        return self._caches.put(
            self._attrs, raws, (tuple(typed), dumps(rest) if rest else None), size
        )

    def columns(self) -> dict[str, list[Any]]:
        """Everything read so far, column by column (SPAN_COLUMNS)."""
        if not self.rows:
            return {c: [] for c in SPAN_COLUMNS}
        (
            trace_id,
            span_id,
            parent,
            name,
            kind,
            start,
            end,
            code,
            message,
            res,
            scope,
            typed,
            rest,
            events,
            links,
        ) = (list(col) for col in zip(*self.rows, strict=True))
        service, host, pid, resource = (list(col) for col in zip(*res, strict=True))
        cols = {
            "trace_id": trace_id,
            "span_id": span_id,
            "parent_span_id": parent,
            "name": name,
            "kind": kind,
            "start_ns": start,
            "end_ns": end,
            "status_code": code,
            "status_message": message,
            "service": service,
            "host": host,
            "pid": pid,
            "scope": scope,
            "resource": resource,
            "attributes": rest,
            "events": events,
            "links": links,
        }
        cols.update(
            zip(TYPED_COLUMNS, (list(col) for col in zip(*typed, strict=True)), strict=True)
        )
        return cols
