"""Buffered rows -> Arrow, in slices small enough that the traced program never waits.

A decorated call that sets nothing ends as a plain row, seven ints:

    (site, trace_hi, trace_lo, span_id, parent_id, start_ns, end_ns)

(chiptrace.recording.sites numbers the sites). Plain rows convert with one np.fromiter a chunk
and a NumPy take per column. A site row is a plain row followed by the span's attributes,
flat, the keys then the values (`span("s", attributes={"step": 3, "phase": "fwd"})` ends
as `(site, ..., end, "step", "phase", 3, "fwd")`): the
same columns and the attributes' JSON. A general row (chiptrace.recording.rows, 14
long) carries the rest, checked per span.

The writer thread converts a buffer chunk by chunk and sleeps ~0.2 ms between chunks:
a Python thread that never blocks keeps the GIL for up to the switch interval (5 ms),
and that wait lands on whatever call the program's thread is making. A slice of plain
rows (one 1,024-row buffer chunk) holds the GIL for a few tenths of a millisecond, and
so does building a batch of 4,096 of them; general rows cost ~10x more a row, so their
slices are smaller. On a loaded machine a thread can also be preempted while it holds
the GIL: shorter holds make that rarer too.
"""

from __future__ import annotations

import itertools
import json
import math
import operator
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from chiptrace.recording import sites as _sites
from chiptrace.recording.rows import RICH_LEN, rows_to_batch
from chiptrace.schema import (
    ATTRIBUTE_COLUMNS,
    TAG_COLUMNS,
    batch_from_columns,
    dumps,
    ids_to_binary,
)
from chiptrace.vocab import Tags, _encode

PLAIN_LEN = 7
_ints7 = operator.itemgetter(0, 1, 2, 3, 4, 5, 6)
_TYPED_KEYS = frozenset(ATTRIBUTE_COLUMNS)
_EMPTY = "{}"


def _encode_all(attrs: list[Any]) -> list[str | None]:
    """vocab.dumps of each, through its C encoder without a Python frame a row."""
    if _encode is None:
        return list(map(dumps, attrs))
    return list(map("".join, map(_encode, attrs, itertools.repeat(0))))


_flatten = itertools.chain.from_iterable
RICH_SLICE = 256
PAUSE_S = 0.0002


@dataclass
class SiteColumns:
    """Per-site column values, for NumPy takes by site number (built on the writer thread)."""

    n: int
    name_codes: np.ndarray  # per-site index into name_dict (names repeat across tags)
    name_dict: pa.Array
    kinds: np.ndarray
    has_attributes: np.ndarray  # sites whose decorator set static attributes
    codes: dict[str, np.ndarray]  # tag column -> per-site index into dicts[col], -1: null
    dicts: dict[str, pa.Array]


class _SiteTable:
    """The sites seen so far as growing code lists; only new sites cost work (a cycle of
    100,000 link ids adds them over many flushes, and a rebuild of all would hold the GIL
    for ~0.1 s each time)."""

    def __init__(self) -> None:
        self.n = 0
        self.where: dict[str, dict[str, int]] = {c: {} for c in (*TAG_COLUMNS, "name")}
        self.codes: dict[str, list[int]] = {c: [] for c in (*TAG_COLUMNS, "name")}
        self.kinds: list[int] = []
        self.static: list[bool] = []
        self.cached: SiteColumns | None = None

    def _code(self, col: str, value: str | None) -> int:
        if value is None:
            return -1
        where = self.where[col]
        found = where.get(value)
        if found is None:
            found = where[value] = len(where)
        return found

    def add(self, names: list[str], kinds: list[int], tags: list[Tags]) -> None:
        for i, (name, kind, t) in enumerate(zip(names, kinds, tags)):
            if i and not i % 1024:
                pause()  # 100,000 new sites at once would hold the GIL for ~0.3 s
            self.codes["name"].append(self._code("name", name))
            for col in TAG_COLUMNS:
                self.codes[col].append(self._code(col, getattr(t, col)))
            self.kinds.append(kind)
            self.static.append(t.attributes is not None)
        self.n += len(names)

    def columns(self) -> SiteColumns:
        got = self.cached
        if got is not None and got.n == self.n:
            return got
        dicts = {c: pa.array(list(self.where[c]), pa.string()) for c in self.where}
        codes = {c: np.array(v, dtype=np.int32) for c, v in self.codes.items()}
        got = SiteColumns(
            n=self.n,
            name_codes=codes.pop("name"),
            name_dict=dicts.pop("name"),
            kinds=np.array(self.kinds, dtype=np.int8),
            has_attributes=np.array(self.static, dtype=bool),
            codes=codes,
            dicts=dicts,
        )
        self.cached = got
        return got


_table = _SiteTable()
_table_lock = threading.Lock()


def site_columns(needed: int) -> SiteColumns:
    """Column values of sites 0..n-1, n >= `needed` (extended when sites were added)."""
    with _table_lock:
        if _table.n < needed:
            _table.add(*_sites.snapshot(_table.n))
        return _table.columns()


def _after_fork_in_child() -> None:
    """A fork while the writer was in _SiteTable.add (it pauses every 1,024 sites) leaves
    the code lists ahead of `n`: the child drops the part rows, so its sites read right."""
    global _table_lock
    _table_lock = threading.Lock()
    t = _table
    for codes in t.codes.values():
        del codes[t.n :]
    del t.kinds[t.n :], t.static[t.n :]
    t.cached = None


os.register_at_fork(after_in_child=_after_fork_in_child)


def _trace_ids(hi: np.ndarray, lo: np.ndarray) -> pa.FixedSizeBinaryArray:
    both = np.empty((len(hi), 2), dtype=">u8")
    both[:, 0] = hi
    both[:, 1] = lo
    buf = pa.py_buffer(both.tobytes())
    return pa.FixedSizeBinaryArray.from_buffers(pa.binary(16), len(hi), [None, buf])


def _dict_column(codes: np.ndarray, dictionary: pa.Array) -> pa.DictionaryArray:
    missing = codes < 0
    indices = pa.array(codes, mask=missing) if missing.any() else pa.array(codes)
    return pa.DictionaryArray.from_arrays(indices, dictionary)


def plain_batch(
    a: np.ndarray, constants: Mapping[str, Any], attributes: list[str | None] | None = None
) -> pa.RecordBatch:
    """One RecordBatch from plain rows (as an n x 7 uint64 array) of numbered sites
    without static attributes (`attributes`: their JSON, for rows that carried some)."""
    n = len(a)
    site = a[:, 0].astype(np.int32)
    cols = site_columns(int(site.max()) + 1 if n else 0)
    columns: dict[str, Any] = {
        "trace_id": _trace_ids(a[:, 1], a[:, 2]),
        "span_id": ids_to_binary(a[:, 3]),
        "parent_span_id": ids_to_binary(a[:, 4], zero_is_null=True),
        "name": _dict_column(cols.name_codes[site], cols.name_dict),
        "kind": cols.kinds[site],
        "start_ns": a[:, 5].view(np.int64),
        "end_ns": a[:, 6].view(np.int64),
        **{c: _dict_column(cols.codes[c][site], cols.dicts[c]) for c in TAG_COLUMNS},
        **constants,
    }
    if attributes is not None:
        columns["attributes"] = attributes
    return batch_from_columns(columns, n)


def is_site_row(row: tuple[Any, ...]) -> bool:
    """A plain row followed by attributes, keys then values: an odd length past 7 (a
    general row is RICH_LEN, 14, long)."""
    return len(row) & 1 == 1 and len(row) > PLAIN_LEN


def site_row_attributes(row: tuple[Any, ...]) -> dict[str, Any]:
    """The attributes a site row carries flat after its seven ints: the keys, then the
    values."""
    k = (len(row) - PLAIN_LEN) // 2
    return dict(zip(row[PLAIN_LEN : PLAIN_LEN + k], row[PLAIN_LEN + k :]))


def _all_attributes(rows: Sequence[tuple[Any, ...]]) -> list[dict[str, Any]]:
    """site_row_attributes of each row; rows of one length (one call site, the usual
    case) through C-level maps of item getters, without a Python frame a row."""
    n = len(rows[0]) if rows else 0
    if any(len(r) != n for r in rows):
        return list(map(site_row_attributes, rows))
    k = (n - PLAIN_LEN) // 2
    keys = operator.itemgetter(*range(PLAIN_LEN, PLAIN_LEN + k))
    vals = operator.itemgetter(*range(PLAIN_LEN + k, n))
    if n == 9:  # one attribute: the getters return the item, not a tuple
        return [{k: v} for k, v in zip(map(keys, rows), map(vals, rows))]
    return list(map(dict, map(zip, map(keys, rows), map(vals, rows))))


_ESCAPE = json.encoder.encode_basestring_ascii  # vocab.dumps' string encoder
_BOOL_JSON = {True: "true", False: "false"}


def _column_json(values: list[Any]) -> list[str] | None:
    """Each value as vocab.dumps writes it, a whole column at a time in C-level maps, for a
    column of one plain type; None for anything else (the general path takes it)."""
    types = set(map(type, values))
    if types == {int}:
        return list(map(int.__repr__, values))
    if types == {str}:
        return list(map(_ESCAPE, values))
    if types == {bool}:
        return list(map(_BOOL_JSON.__getitem__, values))
    if types == {float} and all(map(math.isfinite, values)):
        return list(map(float.__repr__, values))
    return None


def _columns_json(rows: Sequence[tuple[Any, ...]]) -> list[str | None] | None:
    """The attributes' JSON of site rows that all carry the same keys (one call site, the
    usual case), built a column at a time: vocab.dumps' exact text without a dict or an
    encoder call a row (~0.3 against ~0.85 us a row). None where it does not apply."""
    n = len(rows[0])
    if n <= PLAIN_LEN or len(set(map(len, rows))) != 1:
        return None
    k = (n - PLAIN_LEN) // 2
    keys = rows[0][PLAIN_LEN : PLAIN_LEN + k]
    if len(set(map(operator.itemgetter(slice(PLAIN_LEN, PLAIN_LEN + k)), rows))) != 1:
        return None
    if not _TYPED_KEYS.isdisjoint(keys) or set(map(type, keys)) != {str}:
        return None  # typed attributes are checked per span; JSON keys must be strings
    parts: list[Any] = []
    for j, key in enumerate(keys):
        encoded = _column_json(list(map(operator.itemgetter(PLAIN_LEN + k + j), rows)))
        if encoded is None:
            return None
        parts += [itertools.repeat(("{" if j == 0 else ",") + _ESCAPE(key) + ":"), encoded]
    parts.append(itertools.repeat("}"))
    return list(map("".join, zip(*parts)))


def _attributes_json(rows: Sequence[tuple[Any, ...]]) -> tuple[list[str | None], list[int]]:
    """The JSON of site rows' attributes (position 7), and the positions of rows that
    need the general conversion: a typed key (`op.bytes`, `chip.id`: its own column,
    checked) or a value JSON cannot take. C-level maps when all are plain (~0.5 us a row
    against ~2 us through chiptrace.recording.rows)."""
    by_column = _columns_json(rows)
    if by_column is not None:
        return by_column, []
    attrs = _all_attributes(rows)
    if not all(map(_TYPED_KEYS.isdisjoint, attrs)):
        return _attributes_json_slow(attrs)
    try:  # vocab.dumps without its Python frame: ~0.15 us a row less
        text: list[str | None] = _encode_all(attrs)
    except (TypeError, ValueError, RecursionError):
        return _attributes_json_slow(attrs)
    if _EMPTY in text:  # `attributes={}`: no attributes, as a general row writes it
        text = [None if t == _EMPTY else t for t in text]
    return text, []


def _attributes_json_slow(attrs: list[Any]) -> tuple[list[str | None], list[int]]:
    text: list[str | None] = []
    general: list[int] = []
    for i, d in enumerate(attrs):
        if _TYPED_KEYS.isdisjoint(d):
            try:
                text.append(dumps(d) if d else None)
                continue
            except (TypeError, ValueError):
                pass
        general.append(i)
        text.append(None)
    return text, general


def _as_rich(row: tuple[Any, ...]) -> tuple[Any, ...]:
    """A site row as a general one (its site's decorator set static attributes, or its
    attributes need checking per span)."""
    i = row[0]
    attrs = site_row_attributes(row) if len(row) > PLAIN_LEN else None
    return (_sites.TAGS[i], *row[1:7], _sites.NAMES[i], _sites.KINDS[i], 0, None, attrs, None, None)


class Converter:
    """Converts one flush, slice by slice (`add`), into batches (`finish`).

    Plain and site rows wait as NumPy arrays (site rows' attributes as JSON beside them)
    and become one batch per GROUP rows: building a batch costs about a millisecond
    whatever its size, so a batch per slice would cost more than the slice. General rows
    become a batch per slice (they are checked per span).
    """

    GROUP = 4096

    def __init__(
        self, constants: Mapping[str, Any], pause: Callable[[], None] | None = None
    ) -> None:
        self.constants = constants
        self.pause = pause  # called between pieces of general rows
        self.batches: list[pa.RecordBatch] = []
        self.bad: dict[int, str] = {}  # why each left-out span was left out
        self.lost = 0  # spans a failed conversion cost (a bug: logged where caught)
        self._arrays: list[np.ndarray] = []
        self._texts: list[list[str | None] | None] = []  # per array: attributes' JSON
        self._waiting = 0

    def add(self, rows: Sequence[tuple[Any, ...]]) -> None:
        """Convert one slice: a buffer chunk (1,024 rows at most)."""
        lengths = set(map(len, rows))
        if lengths == {PLAIN_LEN}:
            rich = self._add_plain(rows)
        elif RICH_LEN not in lengths and PLAIN_LEN not in lengths:
            rich = self._add_site_rows(rows)
        else:
            rich = [r for r in rows if len(r) == RICH_LEN]
            rich += self._add_plain([r for r in rows if len(r) == PLAIN_LEN])
            rich += self._add_site_rows([r for r in rows if is_site_row(r)])
        for start in range(0, len(rich), RICH_SLICE):
            if start and self.pause is not None:
                self.pause()
            batch, bad = rows_to_batch(rich[start : start + RICH_SLICE], self.constants)
            self.batches.append(batch)
            for why in bad.values():
                self.bad[len(self.bad)] = why

    def _add_plain(self, rows: Sequence[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
        """Queue plain rows; returns those of sites with static attributes, as general
        rows (checked per span)."""
        if not rows:
            return []
        # fromiter over the flattened rows: 2.4x faster than np.array on the tuples.
        flat = np.fromiter(_flatten(rows), np.uint64, PLAIN_LEN * len(rows))
        a = flat.reshape(len(rows), PLAIN_LEN)
        static = self._static(a)
        if static.any():  # sites whose decorator set attributes: checked as general rows
            self._queue(a[~static], None)
            return [_as_rich(rows[i]) for i in np.flatnonzero(static).tolist()]
        self._queue(a, None)
        return []

    def _add_site_rows(self, rows: Sequence[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
        """Queue site rows with attributes (`span(..., attributes=...)`); returns those
        that need the general conversion, as general rows."""
        if not rows:
            return []
        flat = np.fromiter(_flatten(map(_ints7, rows)), np.uint64, PLAIN_LEN * len(rows))
        a = flat.reshape(len(rows), PLAIN_LEN)
        text, general = _attributes_json(rows)
        static = self._static(a)
        if not general and not static.any():
            self._queue(a, text)
            return []
        static[general] = True
        keep = ~static
        self._queue(a[keep], [t for t, k in zip(text, keep.tolist()) if k])
        return [_as_rich(rows[i]) for i in np.flatnonzero(static).tolist()]

    @staticmethod
    def _static(a: np.ndarray) -> np.ndarray:
        site = a[:, 0].astype(np.int32)
        return site_columns(int(site.max()) + 1).has_attributes[site]

    def _queue(self, a: np.ndarray, text: list[str | None] | None) -> None:
        if len(a):
            self._arrays.append(a)
            self._texts.append(text)
            self._waiting += len(a)

    @property
    def due(self) -> bool:
        """Enough rows wait for a batch (the caller builds it between pauses)."""
        return self._waiting >= self.GROUP

    def build(self) -> None:
        """One batch of the plain and site rows waiting."""
        arrays, texts, n = self._arrays, self._texts, self._waiting
        self._arrays, self._texts, self._waiting = [], [], 0
        try:
            a = arrays[0] if len(arrays) == 1 else np.concatenate(arrays)
            attributes: list[str | None] | None = None
            if any(t is not None for t in texts):
                attributes = []
                for arr, t in zip(arrays, texts):
                    attributes += t if t is not None else [None] * len(arr)
            self.batches.append(plain_batch(a, self.constants, attributes))
        except Exception:  # noqa: BLE001 - counted by the caller, never raised into it
            self.lost += n
            raise

    def finish(self) -> list[pa.RecordBatch]:
        if self._arrays:
            self.build()
        return self.batches


def convert(
    rows: Sequence[tuple[Any, ...]], constants: Mapping[str, Any]
) -> tuple[list[pa.RecordBatch], dict[int, str]]:
    """Batches for a few rows at once, and {i: why} for the general rows left out."""
    conv = Converter(constants)
    conv.add(rows)
    return conv.finish(), conv.bad


def pause() -> None:
    """Hand the GIL to the program's threads between slices."""
    time.sleep(PAUSE_S)
