"""Finished span objects -> Arrow batches, off the traced program's hot path.

A traced call appends its finished span object to the recorder's deque (the cheapest
thing Python can do); the writer thread turns a whole buffer of them into columns at
once. A row is any object with these fields (chiptrace.api.Span has them):

    trace_id: bytes16, span_id: int, parent_id: int (0 = root), name, kind,
    start_ns, end_ns, status_code, status_message, tags: Tags,
    attributes: dict | None, events: list | None, links: list | None
"""

from __future__ import annotations

import operator
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from chiptrace.schema import (
    ATTRIBUTE_COLUMNS,
    TAG_COLUMNS,
    batch_from_columns,
    dumps,
    empty_batch,
    ids_to_binary,
    trace_ids_to_binary,
)

_INT_COLUMNS = ("op_bytes", "op_flops")
_FIELDS = operator.attrgetter(
    "trace_id", "span_id", "parent_id", "name", "kind", "start_ns", "end_ns", "status_code",
    "status_message", "tags", "attributes", "events", "links",
)  # fmt: skip


def _split_attributes(
    static: Mapping[str, Any] | None, dynamic: Mapping[str, Any] | None
) -> tuple[dict[str, Any], dict[str, Any] | None]:
    merged = {**static, **dynamic} if static and dynamic else dict(static or dynamic or {})
    typed = {ATTRIBUTE_COLUMNS[k]: merged.pop(k) for k in list(merged) if k in ATTRIBUTE_COLUMNS}
    return typed, merged or None


def _json_events(events: Sequence[Any]) -> str:
    return dumps([{"name": n, "time_ns": t, "attributes": a or {}} for n, t, a in events])


def _json_links(links: Sequence[Any]) -> str:
    return dumps(
        [{"trace_id": t.hex(), "span_id": f"{s:016x}", "attributes": a or {}} for t, s, a in links]
    )


def rows_to_batch(rows: Sequence[Any], constants: Mapping[str, Any]) -> pa.RecordBatch:
    """Convert decorated-span row tuples to one RecordBatch of the span schema.

    Args:
        rows: span objects with the fields in this module's docstring.
        constants: per-process columns (service, host, pid, scope, resource).
    """
    n = len(rows)
    if n == 0:
        return empty_batch()
    (trace_ids, span_ids, parents, names, kinds, starts, ends, codes, messages,
     tags, attrs, events, links) = zip(*map(_FIELDS, rows), strict=False)  # fmt: skip
    tag_cols: dict[str, list[Any]] = {c: [getattr(t, c) for t in tags] for c in TAG_COLUMNS}
    int_cols: dict[str, list[Any]] = {c: [None] * n for c in _INT_COLUMNS}
    attr_json: list[str | None] = [None] * n
    for i in range(n):
        static, dynamic = tags[i].attributes, attrs[i]
        if not static and not dynamic:
            continue
        typed, rest = _split_attributes(static, dynamic)
        for col, value in typed.items():
            (int_cols if col in int_cols else tag_cols)[col][i] = value
        if rest:
            attr_json[i] = dumps(rest)
    columns: dict[str, Any] = {
        "trace_id": trace_ids_to_binary(trace_ids),
        "span_id": ids_to_binary(span_ids),
        "parent_span_id": ids_to_binary(parents, zero_is_null=True),
        "name": names,
        "kind": np.fromiter(kinds, np.int8, n),
        "start_ns": np.fromiter(starts, np.int64, n),
        "end_ns": np.fromiter(ends, np.int64, n),
        "status_code": np.fromiter(codes, np.int8, n),
        "status_message": list(messages),
        "attributes": attr_json,
        "events": [_json_events(e) if e else None for e in events],
        "links": [_json_links(lk) if lk else None for lk in links],
        **tag_cols,
        **int_cols,
        **constants,
    }
    return batch_from_columns(columns, n)
