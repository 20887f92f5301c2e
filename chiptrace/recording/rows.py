"""General span rows -> Arrow batches, off the traced program's hot path.

Most spans end as a plain row of ints (chiptrace.recording.fastrows converts those with NumPy).
A span that carries more (attributes, events, links, a status, a renamed or unnumbered
site) ends as a general row, a tuple in this order:

    (tags, trace_hi, trace_lo, span_id, parent_id, start_ns, end_ns, name, kind,
     status_code, status_message, attributes: dict | None, events: list | None,
     links: list | None)

`tags` is a Tags, or past a full tag table the plain (chip, link, op, precision) tuple
of a `_sites.RawTags`, checked here. The values come from user code, so each one is
checked here, per span.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from chiptrace.errors import ChipError
from chiptrace.recording.sites import check
from chiptrace.schema import (
    ATTRIBUTE_COLUMNS,
    COLUMN_ATTRIBUTES,
    NO_TAGS,
    TAG_COLUMNS,
    batch_from_columns,
    chip_type_of,
    dumps,
    empty_batch,
    ids_to_binary,
    trace_ids_to_binary,
)

# Positions in a general row after the ids and times; the first seven match a plain row.
_RICH_FIELDS = (
    "tags",
    "trace_hi",
    "trace_lo",
    "span_id",
    "parent_id",
    "start_ns",
    "end_ns",
    "name",
    "kind",
    "status_code",
    "status_message",
    "attributes",
    "events",
    "links",
)
RICH_LEN = len(_RICH_FIELDS)


def _json_events(events: Sequence[Any]) -> str:
    return dumps([{"name": n, "time_ns": t, "attributes": a or {}} for n, t, a in events])


def _json_links(links: Sequence[Any]) -> str:
    return dumps(
        [{"trace_id": t.hex(), "span_id": f"{s:016x}", "attributes": a or {}} for t, s, a in links]
    )


def _tag_columns(
    tags: Sequence[Any], bad: dict[int, str]
) -> tuple[dict[str, pa.Array], list[Any], np.ndarray]:
    """Tag columns from the few distinct Tags objects (one per decorator), gathered in C."""
    keys = list(map(id, tags))
    by_id = dict(zip(keys, tags))  # C-level loops only: this runs once per buffered span
    position = {k: i for i, k in enumerate(by_id)}
    uniq = list(by_id.values())
    idx = np.fromiter(map(position.__getitem__, keys), np.int32, len(keys))
    _check_raw(uniq, idx, bad)
    take = pa.array(idx)
    cols = {c: pa.array([getattr(u, c) for u in uniq], pa.string()).take(take) for c in TAG_COLUMNS}
    return cols, uniq, idx


def _check_raw(uniq: list[Any], idx: np.ndarray, bad: dict[int, str]) -> None:
    """Tags a full table left unchecked (_sites.RawTags' key) checked here, once per value: a
    bad one costs the spans that carry it."""
    checked: dict[Any, Any] = {}
    for j, u in enumerate(uniq):
        if u.__class__ is not tuple:  # a Tags; a full table's unchecked ones are key tuples
            continue
        if u not in checked:
            try:
                checked[u] = check(u)
            except ChipError as e:
                checked[u] = e
        got = checked[u]
        if isinstance(got, ChipError):
            for i in np.flatnonzero(idx == j).tolist():
                bad.setdefault(i, str(got))
            got = NO_TAGS
        uniq[j] = got


_INT64 = (-(2**63), 2**63 - 1)
_TYPED_KEYS = frozenset(ATTRIBUTE_COLUMNS)
_INT_COLUMNS = frozenset({"op_bytes", "op_flops"})
_BAD_VALUE = (TypeError, ValueError, OverflowError, AttributeError, pa.ArrowException)
_DICT = pa.dictionary(pa.int32(), pa.string())


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _is_int(value: Any) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def _column(
    values: list[Any],
    convert: Callable[[list[Any]], Any],
    what: str,
    placeholder: Any,
    bad: dict[int, str],
) -> Any:  # what: "name (a string)", the field and what it takes
    """`convert(values)`, minus the rows whose value it rejects: those are marked bad and
    converted as `placeholder`. The whole column converts in one C call when every value
    is good, so checking costs nothing then; only a bad buffer pays a loop per row, with
    the same conversion as the judge of each value."""
    try:
        return convert(values)
    except _BAD_VALUE:
        pass
    for i, v in enumerate(values):
        try:
            convert([v])
        except _BAD_VALUE:
            field, _, expected = what.partition(" ")
            reason = f"expected {expected.strip('()')}" if expected else "cannot be encoded"
            bad.setdefault(i, f"{field}={_short(v)}: {reason}")
            values[i] = placeholder
    return convert(values)


def _ints(dtype: Any) -> Callable[[list[Any]], np.ndarray]:
    return lambda values: np.fromiter(values, dtype, len(values))


def _fits(col: str, value: Any) -> bool:
    """Whether an attribute value fits its typed column (the collector's rule)."""
    if col in _INT_COLUMNS:
        return _is_int(value) and _INT64[0] <= value <= _INT64[1]
    return isinstance(value, str)


def _attribute_columns(
    attrs: list[Any], uniq: list[Any], tag_idx: np.ndarray, bad: dict[int, str]
) -> tuple[list[str | None], dict[str, dict[int, Any]]]:
    """The JSON `attributes` column and per-row overrides of the typed columns, for the
    rows that carry attributes (static ones from the decorator, or set on the span)."""
    n = len(attrs)
    static = np.array([u.attributes is not None for u in uniq])[tag_idx]
    dynamic = np.fromiter((a is not None for a in attrs), bool, n)
    attr_json: list[str | None] = [None] * n
    overrides: dict[str, dict[int, Any]] = {}
    static_of = [u.attributes for u in uniq]
    for i in np.flatnonzero(static | dynamic).tolist():
        s, d = static_of[tag_idx[i]], attrs[i]
        if s is None and _TYPED_KEYS.isdisjoint(d):  # the usual case: JSON, nothing typed
            try:
                attr_json[i] = dumps(d) if d else None
            except (TypeError, ValueError) as e:  # keys that are not strings, a cycle
                bad.setdefault(i, f"attributes: {e}")
            continue
        rest = {**s, **d} if s and d else dict(s or d or {})
        typed = {ATTRIBUTE_COLUMNS[k]: rest.pop(k) for k in list(rest) if k in ATTRIBUTE_COLUMNS}
        reason = None
        for col, value in typed.items():
            if _fits(col, value):
                continue
            expected = "an integer (int64)" if col in _INT_COLUMNS else "a string"
            reason = f"{COLUMN_ATTRIBUTES[col]}={_short(value)}: expected {expected}"
            break
        if reason is None and rest:
            try:
                attr_json[i] = dumps(rest)
            except (TypeError, ValueError) as e:  # keys that are not strings, a cycle
                reason = f"attributes: {e}"
        if reason is not None:
            bad.setdefault(i, reason)
            continue
        if "chip_id" in typed and "chip_type" not in typed:
            typed["chip_type"] = chip_type_of(typed["chip_id"])
        for col, value in typed.items():
            overrides.setdefault(col, {})[i] = value
    return attr_json, overrides


def _checked_columns(field: dict[str, list[Any]], bad: dict[int, str]) -> dict[str, Any]:
    """The columns whose values come from the user (names, status, kind, end time,
    events, links), converted; the rows whose value does not convert are marked bad."""
    names = _column(field["name"], lambda v: pa.array(v, _DICT), "name (a string)", "", bad)
    for i in np.flatnonzero(names.is_null()).tolist() if names.null_count else ():
        bad.setdefault(i, "name=None: expected a string")
    return {
        "name": names,
        "status_message": _column(
            field["status_message"],
            lambda v: pa.array(v, pa.string()),
            "status_description (a string)",
            None,
            bad,
        ),
        "kind": _column(field["kind"], _ints(np.int8), "kind (a span kind, 0-5)", 0, bad),
        "end_ns": _column(field["end_ns"], _ints(np.int64), "end_time (integer Unix ns)", 0, bad),
        "events": _column(
            field["events"],
            lambda v: [_json_events(e) if e else None for e in v],
            "events",
            None,
            bad,
        ),
        "links": _column(
            field["links"],
            lambda v: [_json_links(lk) if lk else None for lk in v],
            "links",
            None,
            bad,
        ),
    }


def _override(columns: dict[str, Any], overrides: dict[str, dict[int, Any]], n: int) -> None:
    """Typed attributes set on a span win over its decorator's tag columns."""
    for col, values in overrides.items():
        if not values:
            continue
        base = columns.get(col)
        merged = base.to_pylist() if isinstance(base, pa.Array) else [None] * n
        for i, v in values.items():
            merged[i] = v
        columns[col] = merged


def rows_to_batch(
    rows: Sequence[Any], constants: Mapping[str, Any]
) -> tuple[pa.RecordBatch, dict[int, str]]:
    """Convert general rows (this module's docstring) to one RecordBatch of the span schema.

    Each span is checked on its own, as the collector checks each value: a value that
    does not fit its column (`op.bytes="4 MiB"`, a name that is not a string, an end
    time that is not an integer) costs that span, not the buffer.

    Args:
        rows: general rows, as in this module's docstring.
        constants: per-process columns (service, host, pid, scope, resource).

    Returns:
        The batch of the good spans, and {row index: why} for the spans left out.
    """
    n = len(rows)
    if n == 0:
        return empty_batch(), {}
    field = {f: list(col) for f, col in zip(_RICH_FIELDS, zip(*rows))}
    mask = (1 << 64) - 1
    field["trace_id"] = [
        ((h << 64) | (lo & mask)).to_bytes(16, "big")
        for h, lo in zip(field["trace_hi"], field["trace_lo"])
    ]
    bad: dict[int, str] = {}
    checked = _checked_columns(field, bad)
    tag_cols, uniq, tag_idx = _tag_columns(field["tags"], bad)
    attr_json, overrides = _attribute_columns(field["attributes"], uniq, tag_idx, bad)
    for i in bad:  # left out below: no typed override needs to convert for them
        for values in overrides.values():
            values.pop(i, None)
    columns: dict[str, Any] = {
        "trace_id": trace_ids_to_binary(field["trace_id"]),
        "span_id": ids_to_binary(field["span_id"]),
        "parent_span_id": ids_to_binary(field["parent_id"], zero_is_null=True),
        "start_ns": np.fromiter(field["start_ns"], np.int64, n),
        "status_code": np.fromiter(field["status_code"], np.int8, n),
        "attributes": attr_json,
        **checked,
        **tag_cols,
        **constants,
    }
    _override(columns, overrides, n)
    batch = batch_from_columns(columns, n)
    if bad:
        keep = np.ones(n, dtype=bool)
        keep[list(bad)] = False
        batch = batch.filter(pa.array(keep))
    return batch, bad
