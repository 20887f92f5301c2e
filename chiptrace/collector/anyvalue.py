"""opentelemetry-proto `AnyValue` and `KeyValue` messages as Python values, and the span
columns made of them (events, links, a resource).

Shared by the protobuf reader (span_reader.py: events, links, resources) and the decoder
(decode.py), which imports the reader: here, neither imports the other for them.
"""

from __future__ import annotations

import base64
import struct
from typing import Any

from opentelemetry.proto.trace.v1.trace_pb2 import Span

from chiptrace._protowire import fields
from chiptrace.schema import dumps


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
    values nested past MAX_VALUE_DEPTH become TRUNCATED. `truncated` counts the cuts,
    `replaced` the strings that held invalid UTF-8."""

    def __init__(self) -> None:
        self.truncated = 0
        self.replaced = 0

    def text(self, raw: bytes) -> str:
        """UTF-8 bytes as text; invalid sequences become U+FFFD (and are counted)."""
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            self.replaced += 1
            return raw.decode("utf-8", "replace")

    def key_values(self, buf: bytes, lo: int, hi: int, number: int) -> dict[str, Any]:
        """The repeated KeyValue field `number` of the message in buf[lo:hi], as a dict."""
        return dict(
            self.key_value(buf, v[0], v[1])
            for n, w, v in fields(buf, lo, hi)
            if n == number and w == 2
        )

    def key_value(self, buf: bytes, lo: int, hi: int, depth: int = 0) -> tuple[str, Any]:
        key, value = "", None
        for num, wt, v in fields(buf, lo, hi):
            if num == 1 and wt == 2:
                key = self.text(buf[v[0] : v[1]])
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
                value = self.text(buf[v[0] : v[1]])
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


def events_json(raws: list[bytes]) -> str:
    """A span's Event messages as the `events` column's JSON."""
    out = []
    for raw in raws:
        e = Span.Event.FromString(raw)
        out.append(
            {"name": e.name, "time_ns": e.time_unix_nano, "attributes": key_values(e.attributes)}
        )
    return dumps(out)


def links_json(raws: list[bytes]) -> str:
    """A span's Link messages as the `links` column's JSON."""
    out = []
    for raw in raws:
        lk = Span.Link.FromString(raw)
        out.append(
            {
                "trace_id": lk.trace_id.hex(),
                "span_id": lk.span_id.hex(),
                "attributes": key_values(lk.attributes),
            }
        )
    return dumps(out)


def resource_row(attrs: dict[str, Any]) -> tuple[str, str | None, int | None, str]:
    """(service, host, pid, attributes JSON) of a resource's attributes."""
    pid = attrs.get("process.pid")
    host = attrs.get("host.name")
    return (
        str(attrs.get("service.name") or "unknown_service"),
        str(host) if host is not None else None,
        pid
        if isinstance(pid, int) and not isinstance(pid, bool) and -(2**31) <= pid < 2**31
        else None,
        dumps(attrs),
    )
