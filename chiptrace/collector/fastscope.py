"""The spans of one `ScopeSpans` read column by column with NumPy, for the shape SDKs write.

wire.SpanReader reads a span at a time: ~2.7 us a span in Python, most of a request's cost
(bench_collect). Every OpenTelemetry SDK writes a span's fields in field-number order:
trace id, span id, an optional parent, name, kind, start, end, then the rest (the "tail":
attributes, status, flags), and the ids and times have fixed sizes. So the offsets of every
field follow from each span's start offset and two length bytes (parent present, name
length), and a scope's ids, names, kinds and times are gathered for all of its spans at
once. Only the tail is looked up per span, in the reader's cache of decoded tails (spans of
one process repeat a few tails); the columns of the tails are built once per distinct tail
and spread with one `take`.

A scope with any span of another shape (a name of 128 bytes or more, fields out of order,
a tail too large to cache, times past int64) returns None, and the reader takes it span by
span as before.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from chiptrace.schema import ATTRIBUTE_COLUMNS, SPAN_SCHEMA, batch_from_columns

# Below this many spans the arrays cost more than they save (~40 us a scope).
MIN_SPANS = 32
_TYPED = tuple(ATTRIBUTE_COLUMNS.values())
_ID16 = np.arange(16)
_ID8 = np.arange(8)
_NO_ID = bytes(8)
# Columns whose one repeated value is stored as one dictionary entry. A plain string column
# is not made from one value: the schema builds that with NumPy, as UCS-4 (a 10 MB attribute
# took a 40 MB array and 15 ms).
DICT_COLUMNS = frozenset(f.name for f in SPAN_SCHEMA if pa.types.is_dictionary(f.type))

TailInfo = Callable[[bytes], "tuple[Any, ...] | None"]


def _gather(u8: np.ndarray, at: np.ndarray, width: np.ndarray) -> bytes:
    """The bytes u8[at[i] : at[i] + width] of every span, concatenated."""
    return u8[at[:, None] + width].tobytes()


def _fixed(data: bytes, width: int, n: int, valid: np.ndarray | None = None) -> pa.Array:
    bitmap = None
    if valid is not None and not valid.all():
        bitmap = pa.py_buffer(np.packbits(valid, bitorder="little").tobytes())
    return pa.FixedSizeBinaryArray.from_buffers(pa.binary(width), n, [bitmap, pa.py_buffer(data)])


def _times(u8: np.ndarray, at: np.ndarray) -> np.ndarray:
    """The little-endian fixed64 at each offset, as int64 (negative: past int64)."""
    return np.ascontiguousarray(u8[at[:, None] + _ID8]).view("<i8").ravel()


def _names(buf: bytes, u8: np.ndarray, at: np.ndarray, size: np.ndarray) -> pa.Array:
    """Each span's name (`size` bytes at `at`), dictionary-encoded; invalid UTF-8 becomes
    U+FFFD as on the per-span path."""
    offsets = np.zeros(len(at) + 1, dtype=np.int32)
    np.cumsum(size, out=offsets[1:])
    total = int(offsets[-1])
    data = u8[np.repeat(at - offsets[:-1], size) + np.arange(total)].tobytes() if total else b""
    names = pa.StringArray.from_buffers(
        len(at), pa.py_buffer(offsets.tobytes()), pa.py_buffer(data)
    )
    try:
        names.validate(full=True)
    except pa.ArrowInvalid:
        names = pa.array(
            [buf[a : a + z].decode("utf-8", "replace") for a, z in zip(at.tolist(), size.tolist())],
            pa.string(),
        )
    return names.dictionary_encode()


def _tail_columns(uniq: list[tuple[Any, ...]], index: list[int]) -> dict[str, Any]:
    """The columns a span's tail decides (typed attributes, the rest, status, events,
    links), built once per distinct tail (`uniq`) and spread over the spans with one take
    (`index`: each span's tail in uniq)."""
    take = pa.array(index, pa.int32())
    cols: dict[str, Any] = {}
    for j, name in enumerate(_TYPED):
        cols[name] = [u[0][j] for u in uniq]
    cols["attributes"] = [u[1] for u in uniq]
    cols["status_code"] = [u[2][0] for u in uniq]
    cols["status_message"] = [u[2][1] for u in uniq]
    cols["events"] = [u[3] for u in uniq]
    cols["links"] = [u[4] for u in uniq]
    out: dict[str, Any] = {}
    for name, values in cols.items():
        first = values[0]
        if (first is None or (isinstance(first, str) and name in DICT_COLUMNS)) and values.count(
            first
        ) == len(values):
            out[name] = first  # one value for every span: a constant column
        else:
            out[name] = pa.array(values, SPAN_SCHEMA.field(name).type).take(take)
    return out


def scope_batch(
    buf: bytes,
    spans: Sequence[tuple[int, int]],
    tail_info: TailInfo,
    res: tuple[Any, ...],
    scope: str,
    max_tail: int,
) -> pa.RecordBatch | None:
    """The spans at `spans` ((lo, hi) offsets in `buf`) as one batch of the span schema, or
    None when any of them is not of the SDK shape (see the module docstring).

    Args:
        tail_info: a tail's decoded (typed, rest, status, events, links), None when the
            tail holds a core field (not the SDK shape).
        res: (service, host, pid, resource JSON) of the spans' resource.
        max_tail: tails longer than this are not cached: such a scope goes span by span.
    """
    n = len(spans)
    bounds = np.array(spans, dtype=np.int64)
    s, e = bounds[:, 0], bounds[:, 1]
    u8 = np.frombuffer(buf, dtype=np.uint8)
    if (e - s < 48).any():
        return None
    if not ((u8[s] == 0x0A) & (u8[s + 1] == 16) & (u8[s + 18] == 0x12) & (u8[s + 19] == 8)).all():
        return None
    has_parent = (u8[s + 28] == 0x22) & (u8[s + 29] == 8)
    p = s + 28 + 10 * has_parent
    has_name = u8[p] == 0x2A
    size = np.where(has_name, u8[p + 1], 0).astype(np.int64)
    if (size >= 0x80).any():
        return None
    q = p + np.where(has_name, 2 + size, 0)
    if (q + 20 > e).any():
        return None
    has_kind = (u8[q] == 0x30) & (u8[q + 1] < 0x80)
    kind = np.where(has_kind, u8[q + 1], 0).astype(np.int8)
    q = q + 2 * has_kind
    if (q + 18 > e).any() or not ((u8[q] == 0x39) & (u8[q + 9] == 0x41)).all():
        return None
    start, end = _times(u8, q + 1), _times(u8, q + 10)
    tail_at = q + 18
    if (start < 0).any() or (end < 0).any() or (e - tail_at > max_tail).any():
        return None
    codes: dict[bytes, int] = {}  # distinct tails, in order of first use
    index = [codes.setdefault(buf[a:b], len(codes)) for a, b in zip(tail_at.tolist(), e.tolist())]
    infos = [tail_info(tail) for tail in codes]
    if None in infos:
        return None
    columns = _tail_columns(infos, index)  # type: ignore[arg-type]
    columns.update(
        trace_id=_fixed(_gather(u8, s + 2, _ID16), 16, n),
        span_id=_fixed(_gather(u8, s + 20, _ID8), 8, n),
        parent_span_id=_fixed(_gather(u8, s + 30, _ID8), 8, n, has_parent),
        name=_names(buf, u8, p + 2, size),
        kind=pa.array(kind),
        start_ns=pa.array(start),
        end_ns=pa.array(end),
        service=res[0],
        host=res[1],
        pid=res[2],
        resource=res[3],
        scope=scope,
    )
    return batch_from_columns(columns, n)
