"""opentelemetry-proto `AnyValue` and `KeyValue` messages as Python values.

Shared by the protobuf reader (wire.py: events, links, resources) and the decoder
(decode.py), which imports the reader: here, neither imports the other for them.
"""

from __future__ import annotations

import base64
from typing import Any


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
