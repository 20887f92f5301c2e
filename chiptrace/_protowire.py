"""Protocol Buffers wire format, both directions: the few pieces OTLP needs.

The one hand-written protobuf codec: varints, tags, lengths and fields, written by the OTLP
exporter (and the collector's gRPC trailers) and read by the collector (`read_varint`,
`fields`; its span scanners in collector/_span_scan.py build on them).

The OTLP encoder writes `Span`, `KeyValue` and `AnyValue` bytes itself instead of filling
generated message objects: a message object costs microseconds per field, while most of a
span's bytes here are known before the span is seen (a chip id's whole `KeyValue`, a span
name's field) and are joined, not rebuilt. Field numbers are opentelemetry-proto's
(`trace/v1/trace.proto`, `common/v1/common.proto`); tests parse the output back with
opentelemetry-proto's own classes, so a wrong tag here fails there.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from typing import Any

from chiptrace.errors import ChiptraceError

_U64 = (1 << 64) - 1


def varint(n: int) -> bytes:
    """Base-128 varint; negative numbers as 64-bit two's complement (protobuf int64)."""
    n &= _U64
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


# Lengths below 16 KiB are nearly every length a span has: look them up, don't compute.
_SMALL = [varint(i) for i in range(1 << 14)]


def length(n: int) -> bytes:
    """The varint length prefix of a length-delimited field."""
    return _SMALL[n] if n < 16384 else varint(n)


def field(tag: bytes, payload: bytes) -> bytes:
    """A length-delimited field: tag byte(s), length, payload."""
    return tag + (_SMALL[len(payload)] if len(payload) < 16384 else varint(len(payload))) + payload


def tag(number: int, wire_type: int) -> bytes:
    """The key of a field: `number << 3 | wire_type`, as a varint."""
    return varint(number << 3 | wire_type)


def message_field(number: int, payload: bytes) -> bytes:
    """A length-delimited field by number (for the few messages not on a hot path)."""
    return field(tag(number, 2), payload)


# AnyValue (common.proto): string_value=1, bool_value=2, int_value=3, double_value=4,
# array_value=5, kvlist_value=6, bytes_value=7. ArrayValue/KeyValueList: values=1.
# KeyValue: key=1, value=2.
_DOUBLE = struct.Struct("<d")


def any_value(value: Any) -> bytes:
    """An `AnyValue` message for a JSON-like Python value (bool before int: bool is an int)."""
    if isinstance(value, str):
        return field(b"\x0a", value.encode())
    if isinstance(value, bool):
        return b"\x10\x01" if value else b"\x10\x00"
    if isinstance(value, int):
        return b"\x18" + varint(value)
    if isinstance(value, float):
        return b"\x21" + _DOUBLE.pack(value)
    if isinstance(value, (list, tuple)):
        return field(b"\x2a", b"".join(field(b"\x0a", any_value(v)) for v in value))
    if isinstance(value, Mapping):
        return field(b"\x32", key_values(value, b"\x0a"))
    if isinstance(value, (bytes, bytearray)):
        return field(b"\x3a", bytes(value))
    if value is None:
        return b""  # an empty AnyValue: OTLP's way of saying "no value"
    return field(b"\x0a", str(value).encode())


def key_value(key: str, value: Any) -> bytes:
    """A `KeyValue` message body."""
    return field(b"\x0a", key.encode()) + field(b"\x12", any_value(value))


def key_values(attrs: Mapping[str, Any], field_tag: bytes) -> bytes:
    """Repeated `KeyValue` fields under `field_tag` (the containing message's field)."""
    if not isinstance(attrs, Mapping):
        return b""
    return b"".join(field(field_tag, key_value(k, v)) for k, v in attrs.items())


# ---------------------------------------------------------------- reading


class WireError(ChiptraceError):
    """Bytes that are not a well-formed protobuf message."""


def read_varint(buf: bytes, i: int) -> tuple[int, int]:
    """The varint at `buf[i]` and the offset after it."""
    b = buf[i]
    if b < 0x80:
        return b, i + 1
    result, shift = b & 0x7F, 7
    while True:
        i += 1
        b = buf[i]
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, i + 1
        shift += 7
        if shift > 63:
            raise WireError("varint longer than 10 bytes")


def fields(buf: bytes, start: int, end: int) -> Any:
    """Yield (field number, wire type, value or (lo, hi) slice bounds) over a message."""
    i = start
    while i < end:
        key, i = read_varint(buf, i)
        num, wt = key >> 3, key & 7
        if wt == 2:
            n, i = read_varint(buf, i)
            if i + n > end:
                raise WireError(f"field {num} runs {i + n - end} bytes past its message")
            yield num, 2, (i, i + n)
            i += n
        elif wt == 0:
            v, i = read_varint(buf, i)
            yield num, 0, v
        elif wt == 1:
            if i + 8 > end:
                raise WireError(f"field {num} is cut short")
            yield num, 1, int.from_bytes(buf[i : i + 8], "little")
            i += 8
        elif wt == 5:
            if i + 4 > end:
                raise WireError(f"field {num} is cut short")
            yield num, 5, int.from_bytes(buf[i : i + 4], "little")
            i += 4
        else:
            raise WireError(f"field {num} has unsupported wire type {wt}")
    if i != end:
        raise WireError("a message runs past its end")
