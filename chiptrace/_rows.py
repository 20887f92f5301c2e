"""Finished span objects -> Arrow batches, off the traced program's hot path.

A traced call appends its finished span object to the recorder's deque (the cheapest
thing Python can do); the writer thread turns a whole buffer of them into columns at
once. A row is any object with these fields (chiptrace._span.Span has them):

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

_FIELD_NAMES = (
    "trace_id",
    "span_id",
    "parent_id",
    "name",
    "kind",
    "start_ns",
    "end_ns",
    "status_code",
    "status_message",
    "tags",
    "attributes",
    "events",
    "links",
)


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


def _tag_columns(tags: Sequence[Any]) -> tuple[dict[str, pa.Array], list[Any], np.ndarray]:
    """Tag columns from the few distinct Tags objects (one per decorator), gathered in C."""
    keys = list(map(id, tags))
    by_id = dict(zip(keys, tags))  # C-level loops only: this runs once per buffered span
    position = {k: i for i, k in enumerate(by_id)}
    uniq = list(by_id.values())
    idx = np.fromiter(map(position.__getitem__, keys), np.int32, len(keys))
    take = pa.array(idx)
    cols = {c: pa.array([getattr(u, c) for u in uniq], pa.string()).take(take) for c in TAG_COLUMNS}
    return cols, uniq, idx


def rows_to_batch(rows: Sequence[Any], constants: Mapping[str, Any]) -> pa.RecordBatch:
    """Convert finished span objects to one RecordBatch of the span schema.

    Args:
        rows: span objects with the fields in this module's docstring.
        constants: per-process columns (service, host, pid, scope, resource).
    """
    n = len(rows)
    if n == 0:
        return empty_batch()
    field = {f: list(map(operator.attrgetter(f), rows)) for f in _FIELD_NAMES}
    tag_cols, uniq, tag_idx = _tag_columns(field["tags"])
    attrs = field["attributes"]
    static = np.array([u.attributes is not None for u in uniq])[tag_idx]
    dynamic = np.fromiter((a is not None for a in attrs), bool, n)
    attr_json: list[str | None] = [None] * n
    overrides: dict[str, dict[int, Any]] = {}
    for i in np.flatnonzero(static | dynamic).tolist():
        typed, rest = _split_attributes(uniq[tag_idx[i]].attributes, attrs[i])
        for col, value in typed.items():
            overrides.setdefault(col, {})[i] = value
        if rest:
            attr_json[i] = dumps(rest)
    columns: dict[str, Any] = {
        "trace_id": trace_ids_to_binary(field["trace_id"]),
        "span_id": ids_to_binary(field["span_id"]),
        "parent_span_id": ids_to_binary(field["parent_id"], zero_is_null=True),
        "name": field["name"],
        "kind": np.fromiter(field["kind"], np.int8, n),
        "start_ns": np.fromiter(field["start_ns"], np.int64, n),
        "end_ns": np.fromiter(field["end_ns"], np.int64, n),
        "status_code": np.fromiter(field["status_code"], np.int8, n),
        "status_message": field["status_message"],
        "attributes": attr_json,
        "events": [_json_events(e) if e else None for e in field["events"]],
        "links": [_json_links(lk) if lk else None for lk in field["links"]],
        **tag_cols,
        **constants,
    }
    for col, values in overrides.items():
        base = columns.get(col)
        merged = base.to_pylist() if isinstance(base, pa.Array) else [None] * n
        for i, v in values.items():
            merged[i] = v
        columns[col] = merged
    return batch_from_columns(columns, n)
