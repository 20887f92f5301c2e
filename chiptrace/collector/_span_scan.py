"""The two OTLP span scanners over protobuf bytes (chiptrace._protowire owns the wire
format itself: varints, fields, WireError).

Plain functions over `bytes` and offsets, no message objects (see span_reader.py for why).
"""

from __future__ import annotations

import struct
from typing import Any, Protocol

from chiptrace._protowire import WireError
from chiptrace._protowire import read_varint as varint


class StatusCache(Protocol):
    """Turns a Status message's bytes into (code, message)."""

    def status_of(self, raw: bytes) -> tuple[int, str | None]: ...


_CORE_FIELDS = frozenset({1, 2, 4, 5, 6, 7, 8})
_I63 = 2**63


_IDS = struct.Struct("<BB16sBB8s")  # tag, length, trace id, tag, length, span id
_TIMES = struct.Struct("<BQBQ")  # tag, start_time_unix_nano, tag, end_time_unix_nano


def span_header(buf: bytes, lo: int, hi: int) -> tuple[Any, ...] | None:
    """(trace id, span id, parent, name, kind, start, end, end offset) when the span starts
    with its ids, then its other fixed fields; None otherwise. The bytes after the end
    offset are the span's "tail".

    Straight-line code for the field-number order every SDK writes (ids, parent, name,
    kind, start, end: a third of the cost of a loop over the fields, and this runs once per
    span); any other order takes `_header_any_order`."""
    if hi - lo < 48:
        return None
    t1, n1, trace_id, t2, n2, span_id = _IDS.unpack_from(buf, lo)
    if t1 != 0x0A or n1 != 16 or t2 != 0x12 or n2 != 8:
        return None
    i, parent, name, kind = lo + 28, None, "", 0
    if buf[i] == 0x22 and buf[i + 1] == 8:
        parent = buf[i + 2 : i + 10]
        i += 10
    if i + 2 <= hi and buf[i] == 0x2A:
        n = buf[i + 1]
        if n >= 0x80 or i + 2 + n > hi:
            return _header_any_order(buf, lo, hi, trace_id, span_id)
        name = buf[i + 2 : i + 2 + n].decode("utf-8", "replace")
        i += 2 + n
    if i + 2 <= hi and buf[i] == 0x30 and buf[i + 1] < 0x80:
        kind = buf[i + 1]
        i += 2
    if i + 18 <= hi:
        ts, start, te, end = _TIMES.unpack_from(buf, i)
        if ts == 0x39 and te == 0x41 and start < _I63 and end < _I63:
            return trace_id, span_id, parent, name, kind, start, end, i + 18
    return _header_any_order(buf, lo, hi, trace_id, span_id)


def _header_any_order(
    buf: bytes, lo: int, hi: int, trace_id: bytes, span_id: bytes
) -> tuple[Any, ...] | None:
    i, parent, name, kind, start, end = lo + 28, None, "", 0, 0, 0
    while i + 2 <= hi:
        t = buf[i]
        if t == 0x39 and i + 9 <= hi:  # start_time_unix_nano
            start = int.from_bytes(buf[i + 1 : i + 9], "little")
            i += 9
        elif t == 0x41 and i + 9 <= hi:  # end_time_unix_nano
            end = int.from_bytes(buf[i + 1 : i + 9], "little")
            i += 9
        elif t == 0x22 and buf[i + 1] == 8 and i + 10 <= hi:  # parent_span_id
            parent = buf[i + 2 : i + 10]
            i += 10
        elif t == 0x2A and buf[i + 1] < 0x80 and i + 2 + buf[i + 1] <= hi:  # name
            name = buf[i + 2 : i + 2 + buf[i + 1]].decode("utf-8", "replace")
            i += 2 + buf[i + 1]
        elif t == 0x30 and buf[i + 1] < 0x80:  # kind
            kind = buf[i + 1]
            i += 2
        elif t == 0x85 and buf[i + 1] == 0x01 and i + 6 <= hi:  # flags: not stored
            i += 6
        else:
            break
    if start >= _I63 or end >= _I63:
        return None
    return trace_id, span_id, parent, name, kind, start, end, i


def scan_span(buf: bytes, lo: int, hi: int, reader: StatusCache) -> list[Any]:
    """Every field of a span (or a span's tail), read field by field.

    One function on purpose: it runs for every field of every span not on the fast path,
    and a call per field would cost more than the field.

    Returns:
        [trace_id, span_id, parent, name, kind, start, end, (code, message), attribute
        raws, event raws, link raws, saw a core field].
    """
    out: list[Any] = [b"", b"", b"", "", 0, 0, 0, (0, None), [], [], [], False]
    i = lo
    while i < hi:
        key = buf[i]
        i += 1
        if key >= 0x80:
            key, i = varint(buf, i - 1)
        num, wt = key >> 3, key & 7
        if num in _CORE_FIELDS:
            out[11] = True
        if wt == 2:
            n = buf[i]
            i += 1
            if n >= 0x80:
                n, i = varint(buf, i - 1)
            j = i + n
            if j > hi:
                raise WireError(f"span field {num} runs past the span")
            raw = buf[i:j]
            i = j
            if num == 9:
                out[8].append(raw)
            elif num in (1, 2, 4):
                out[{1: 0, 2: 1, 4: 2}[num]] = raw
            elif num == 5:
                out[3] = raw.decode("utf-8", "replace")
            elif num == 15:
                out[7] = reader.status_of(raw)
            elif num == 11:
                out[9].append(raw)
            elif num == 13:
                out[10].append(raw)
        elif wt == 1:
            j = i + 8
            if j > hi:
                raise WireError(f"span field {num} is cut short")
            if num in (7, 8):
                v = int.from_bytes(buf[i:j], "little")
                out[num - 2] = v if v < _I63 else 0
            i = j
        elif wt == 0:
            v, i = varint(buf, i)
            if num == 6:
                out[4] = v if v < 128 else 0
        elif wt == 5:
            i += 4
        else:
            raise WireError(f"span field {num} has unsupported wire type {wt}")
    if i != hi:
        raise WireError("a span runs past its end")
    return out


def scope_fields(buf: bytes, lo: int, hi: int) -> tuple[tuple[int, int] | None, list[Any]]:
    """(the scope's bounds or None, every span's (lo, hi)) of a ScopeSpans message.

    `fields` without its generator: this runs once per span of every request, and a span's
    tag and one- or two-byte length are read inline.
    """
    scope = None
    spans: list[Any] = []
    append = spans.append
    i = lo
    while i < hi:
        if buf[i] == 0x12:  # spans = 2, length-delimited
            n = buf[i + 1]
            if n < 0x80:
                i += 2
            elif buf[i + 2] < 0x80:
                n = (n & 0x7F) | buf[i + 2] << 7
                i += 3
            else:
                n, i = varint(buf, i + 1)
            j = i + n
            if j > hi:
                raise WireError(f"a span runs {j - hi} bytes past its scope")
            append((i, j))
            i = j
            continue
        key, i = varint(buf, i)
        wt = key & 7
        if wt == 2:
            n, i = varint(buf, i)
            if i + n > hi:
                raise WireError(f"field {key >> 3} runs {i + n - hi} bytes past its scope")
            if key >> 3 == 1:
                scope = (i, i + n)
            i += n
        elif wt == 0:
            _, i = varint(buf, i)
        elif wt in (1, 5):
            i += 8 if wt == 1 else 4
        else:
            raise WireError(f"field {key >> 3} has unsupported wire type {wt}")
    if i != hi:
        raise WireError("a scope runs past its end")
    return scope, spans
