"""Trace Event rows in bulk: the decoded struct, and block -> columns helpers.

Both Trace Event importers (Kineto and plain Chrome) decode events into `Event` structs
whose `args` stay raw JSON bytes: most events' args are only carried into the
`attributes` column, so they are spliced into it as text by Arrow kernels instead of being
parsed into dicts and dumped again (that round trip is most of a json.load's cost).
"""

from __future__ import annotations

import json
import operator
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import msgspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

_NO_ARGS = msgspec.Raw(b"")


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


def id_ints(values: Any) -> np.ndarray:
    """pid / tid values as int64; text ids ("Spans", "") get stable negative stand-ins."""
    try:
        return np.asarray(values, dtype=np.int64)
    except (TypeError, ValueError, OverflowError):
        return np.array([text_id(v) for v in values], dtype=np.int64)


def text_id(value: Any) -> int:
    if isinstance(value, int) and -(1 << 62) < value < (1 << 62):
        return value
    return -1 - (int.from_bytes(str(value).encode()[:7].ljust(7, b"\0"), "big") & ((1 << 55) - 1))


def dict_column(values: Any) -> pa.DictionaryArray:
    """A dictionary<int32, string> column from Python strings."""
    return pa.array(values, pa.string()).dictionary_encode()


def masked(values: Any, valid: np.ndarray, type: pa.DataType) -> pa.Array:
    """values with nulls where not valid. (pa.array's mask= imports pandas: ~0.5 s.)"""
    arr = pa.array(values, type)
    if valid.all():
        return arr
    return pc.if_else(pa.array(valid), arr, pa.scalar(None, type))


def json_texts(values: tuple[Any, ...]) -> pa.Array:
    """JSON text of each value; whole numbers by a vectorised cast, not a dumps per row."""
    try:
        return pa.array(np.asarray(values, dtype=np.int64)).cast(pa.string())
    except (TypeError, ValueError, OverflowError):
        return pa.array([json_text(v) for v in values], pa.string())


def json_text(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def args_attributes(args: tuple[msgspec.Raw, ...], prefix: pa.Array) -> pa.Array:
    """`{<prefix>, <the args' members>}` per row: the raw args spliced as text.

    Args:
        args: raw JSON objects (empty for events without args).
        prefix: per row, JSON members without braces (`"a":1,"b":"x"`), never empty.
    """
    raw = pa.array([bytes(a) for a in args], pa.binary())
    try:
        text = raw.cast(pa.string())
    except pa.ArrowInvalid:  # not UTF-8: keep what decodes, as JSON strings would
        text = pa.array([bytes(a).decode("utf-8", "replace") for a in args], pa.string())
    body = pc.utf8_trim_whitespace(text)
    is_obj = pc.and_(pc.starts_with(body, "{"), pc.ends_with(body, "}"))
    inner = pc.utf8_trim_whitespace(pc.utf8_slice_codeunits(body, 1, -1))
    inner = pc.if_else(is_obj, inner, "")
    sep = pc.if_else(pc.greater(pc.utf8_length(inner), 0), ",", "")
    return pc.binary_join_element_wise("{", prefix, sep, inner, "}", "")
