"""opentelemetry-proto `AnyValue` and `KeyValue` messages as Python values.

Shared by the protobuf reader (span_reader.py: events, links, resources) and the decoder
(decode.py), which imports the reader: here, neither imports the other for them.
"""

from __future__ import annotations

import base64
import struct
from typing import Any

from chiptrace._protowire import fields


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


# Levels of array/kvlist a value may nest; deeper ones are cut (and counted). The protobuf
# parser stops at 100 message levels, 33 kvlists (each is three messages), and used to
# fail the whole request there.
MAX_VALUE_DEPTH = 32
TRUNCATED = "[truncated: nested deeper than 32 levels]"


class RawValueReader:
    """Reads KeyValue / AnyValue wire bytes by hand, for the values the protobuf parser
    refuses: strings with invalid UTF-8 are decoded with U+FFFD as span names are, and
    values nested past MAX_VALUE_DEPTH become TRUNCATED. `truncated` counts the cuts."""

    def __init__(self) -> None:
        self.truncated = 0

    def key_value(self, buf: bytes, lo: int, hi: int, depth: int = 0) -> tuple[str, Any]:
        key, value = "", None
        for num, wt, v in fields(buf, lo, hi):
            if num == 1 and wt == 2:
                key = buf[v[0] : v[1]].decode("utf-8", "replace")
            elif num == 2 and wt == 2:
                value = self.any_value(buf, v[0], v[1], depth)
        return key, value

    def any_value(self, buf: bytes, lo: int, hi: int, depth: int) -> Any:
        value: Any = None
        for num, wt, v in fields(buf, lo, hi):
            if num in (5, 6) and wt == 2 and depth >= MAX_VALUE_DEPTH:
                self.truncated += 1
                value = TRUNCATED
            elif num == 1 and wt == 2:
                value = buf[v[0] : v[1]].decode("utf-8", "replace")
            elif num == 2 and wt == 0:
                value = bool(v)
            elif num == 3 and wt == 0:
                value = v - (1 << 64) if v >= 1 << 63 else v
            elif num == 4 and wt == 1:
                value = struct.unpack("<d", v.to_bytes(8, "little"))[0]
            elif num == 5 and wt == 2:
                value = [
                    self.any_value(buf, a[0], a[1], depth + 1)
                    for n, w, a in fields(buf, v[0], v[1])
                    if n == 1 and w == 2
                ]
            elif num == 6 and wt == 2:
                value = dict(
                    self.key_value(buf, a[0], a[1], depth + 1)
                    for n, w, a in fields(buf, v[0], v[1])
                    if n == 1 and w == 2
                )
            elif num == 7 and wt == 2:
                value = base64.b64encode(buf[v[0] : v[1]]).decode()
        return value
