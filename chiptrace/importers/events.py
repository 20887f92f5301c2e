"""Trace Event rows in bulk: the decoded struct, and block -> columns helpers.

Both Trace Event importers (Kineto and plain Chrome) decode events into `Event` structs
whose `args` stay raw JSON bytes: most events' args are only carried into the
`attributes` column, so they are spliced into it as text by Arrow kernels instead of being
parsed into dicts and dumped again (that round trip is most of a json.load's cost).
"""

from __future__ import annotations

import itertools
import json
import operator
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import msgspec
import numpy as np
import pyarrow as pa

from chiptrace.importers import arrow

_NO_ARGS = msgspec.Raw(b"{}")
_MIN, _MAX = -(1 << 62), 1 << 62
_WS_BYTES = np.frombuffer(b" \t\r\n", np.uint8)


class Event(msgspec.Struct, gc=False):
    """One Trace Event; unknown keys are skipped by the decoder."""

    ph: str = ""
    cat: str = ""
    name: str = ""
    pid: int | str = 0
    tid: int | str = 0
    ts: float = 0.0
    dur: float = -1.0
    id: int | str | None = None
    id2: Any = None  # async events' {"local": ...} or {"global": ...}
    s: str = ""
    args: msgspec.Raw = _NO_ARGS


FIELDS = operator.attrgetter("ph", "cat", "name", "pid", "tid", "ts", "dur", "args")


@dataclass
class Rows:
    """Complete (`X`) events of one block, column by column (Python sequences)."""

    cat: tuple[str, ...]
    name: tuple[str, ...]
    pid: tuple[Any, ...]
    tid: tuple[Any, ...]
    ts: tuple[float, ...]
    dur: tuple[float, ...]
    args: tuple[msgspec.Raw, ...]

    def __len__(self) -> int:
        return len(self.cat)


@dataclass
class Tally:
    """What a file held that is not a span: metadata, flows, skipped events by reason."""

    metadata: int = 0
    flows: int = 0
    skipped: Counter[str] = field(default_factory=Counter)

    def as_dict(self) -> dict[str, Any]:
        return {"metadata": self.metadata, "flows": self.flows, "skipped": dict(self.skipped)}


def split_block(events: list[Event], tally: Tally, others: list[Event]) -> Rows:
    """The block's complete events as columns; the rest go to `others` (`M`, flows, ...).

    `X` events without a duration are skipped and counted; `B`/`E` pairs are left in
    `others` for the caller to pair.
    """
    rows = [r for r in map(FIELDS, events) if r[0] == "X" and r[6] >= 0]
    if len(rows) != len(events):
        for e in events:
            if e.ph != "X":
                others.append(e)
            elif e.dur < 0:
                tally.skipped["X without dur"] += 1
    if not rows:
        return Rows((), (), (), (), (), (), ())
    _, cat, name, pid, tid, ts, dur, args = zip(*rows)
    return Rows(cat, name, pid, tid, ts, dur, args)


def us_to_ns(values: Any) -> np.ndarray:
    """Integer ns from float µs, exact for the 3-decimal µs Kineto writes: the whole µs and
    the fraction are scaled apart, so a 16-digit Unix-µs value keeps its last digit."""
    arr = np.asarray(values, dtype=np.float64)
    whole = np.floor(arr)
    return whole.astype(np.int64) * 1000 + np.rint((arr - whole) * 1000).astype(np.int64)


def id_ints(values: list[Any]) -> tuple[np.ndarray, list[int]]:
    """pid / tid values as int64, and the rows whose value is no integer below 2**62: text
    ids ("Spans", "") and huge numbers, which get stable negative stand-ins."""
    odd: list[int] = []
    try:
        ints = np.array(values, dtype=np.int64)
    except (TypeError, ValueError, OverflowError):
        isint = np.fromiter(map(isinstance, values, itertools.repeat(int)), bool, len(values))
        odd = np.flatnonzero(~isint).tolist()
        clean = list(values)
        for i in odd:
            clean[i] = text_id(values[i])
        try:
            ints = np.array(clean, np.int64)
        except OverflowError:  # integers beyond 64 bits: rare enough to go one by one
            ints = np.array([text_id(v) for v in values], np.int64)
            return ints, [i for i, v in enumerate(values) if text_id(v) != v]
    if len(ints) and not (ints.min() > _MIN and ints.max() < _MAX):
        big = np.flatnonzero((ints <= _MIN) | (ints >= _MAX)).tolist()
        ints[big] = [text_id(values[i]) for i in big]
        odd = sorted(set(odd) | set(big))
    return ints, odd


def text_id(value: Any) -> int:
    if isinstance(value, int) and _MIN < value < _MAX:
        return value
    return -1 - (int.from_bytes(str(value).encode()[:7].ljust(7, b"\0"), "big") & ((1 << 55) - 1))


def json_text(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def args_bodies(args: list[msgspec.Raw]) -> tuple[pa.StringArray, np.ndarray]:
    """Each row's raw args without the opening `{` (its members, then `}`), and whether it
    has members; `}` alone for args that are no object. Spliced after a `{"key":value`
    prefix (and a comma where it has members), the raw text becomes the attributes JSON
    without being parsed: the members keep their bytes, whitespace included.
    """
    n = len(args)
    data = b"".join(args)
    lengths = np.fromiter(map(len, args), np.int32, n)
    text = arrow.binary_from(data, lengths, pa.string())
    try:
        text.validate(full=True)
    except pa.ArrowInvalid:  # not UTF-8: keep what decodes, as JSON strings would
        text = arrow.strings([bytes(a).decode("utf-8", "replace") for a in args])
    # A Raw value has no whitespace around it: an object is `{...}` exactly.
    buf = np.frombuffer(data, np.uint8)
    ends = np.cumsum(lengths, dtype=np.int64)
    starts = ends - lengths
    is_obj = lengths >= 2
    is_obj[is_obj] = (buf[starts[is_obj]] == 0x7B) & (buf[ends[is_obj] - 1] == 0x7D)
    body = arrow.slice_from(text, 1)
    if not is_obj.all():
        body = arrow.call("if_else", arrow.booleans(is_obj), body, arrow.scalar("}"))
    # Members: the first byte after `{` and any whitespace is not the closing `}`.
    rows = np.flatnonzero(is_obj)
    pos = starts[rows] + 1
    while len(rows):
        ws = np.isin(buf[pos], _WS_BYTES)
        if not ws.any():
            break
        pos[ws] += 1
    members = np.zeros(n, bool)
    members[rows] = buf[pos] != 0x7D
    return body, members


def splice(prefixes: list[str], codes: np.ndarray, bodies: pa.Array) -> pa.Array:
    """`{` + prefixes[code] + body per row: the attributes JSON of args_bodies' bodies."""
    heads = arrow.take(arrow.strings(["{" + p for p in prefixes]), codes)
    return arrow.call("binary_join_element_wise", heads, bodies, arrow.scalar(""))


def static_batch(columns: dict[str, Any], n: int) -> pa.RecordBatch:
    """The STATIC_COLUMNS of one block from the columns given (null where not given)."""
    from chiptrace.importers.plan import STATIC_COLUMNS
    from chiptrace.schema import SPAN_SCHEMA

    arrays, fields = [], []
    for name in STATIC_COLUMNS:
        field_ = SPAN_SCHEMA.field(name)
        value = columns.get(name)
        if value is None and name in ("kind", "status_code"):
            value = arrow.numeric(np.full(n, 1 if name == "kind" else 0, np.int8))
        arr = pa.nulls(n, field_.type) if value is None else value
        if arr.type != field_.type:
            arr = arr.cast(field_.type)
        arrays.append(arr)
        fields.append(field_)
    return pa.RecordBatch.from_arrays(arrays, schema=pa.schema(fields))
