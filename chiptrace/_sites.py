"""Span sites: the constant part of a span (name, kind, chip/link/op tags), numbered once.

A decorated function, or a `span("name", chip=...)` call site, produces spans that differ
only in ids and times. The row it buffers carries the site's small number instead of the
name and the Tags object, so a row is a tuple of ints (which the garbage collector stops
tracking), and the writer thread turns the site numbers into columns with one NumPy take
per column (chiptrace._fastrows) instead of a Python loop per span.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from chiptrace.schema import TAG_COLUMNS, Tags

# Names made per call (f"step {i}") would grow the table without end: past this many
# sites a span carries its name and tags in its row instead (the slower, general row).
MAX_SITES = 1 << 16

_lock = threading.Lock()
_index: dict[tuple[str, int, int], int] = {}
NAMES: list[str] = []
KINDS: list[int] = []
TAGS: list[Tags] = []  # keeps each Tags alive, so the id() in _index stays its own


def site(name: Any, tags: Tags, kind: int) -> int:
    """The number of the site (name, tags, kind); -1 when it cannot have one (a name
    that is not a string, or a full table): such spans write the general row."""
    key = (name, id(tags), kind)
    found = _index.get(key)
    if found is not None:
        return found
    if name.__class__ is not str or len(NAMES) >= MAX_SITES:
        return -1
    with _lock:
        found = _index.get(key)
        if found is None:
            found = len(NAMES)
            NAMES.append(name)
            KINDS.append(kind)
            TAGS.append(tags)
            _index[key] = found  # published last: a reader that finds it finds its data
    return found


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


_cached: SiteColumns | None = None


def columns(needed: int) -> SiteColumns:
    """Column values of sites 0..n-1, n >= `needed` (rebuilt when sites were added)."""
    global _cached
    got = _cached
    if got is not None and got.n >= needed:
        return got
    n = len(NAMES)
    tags, names, kinds = TAGS[:n], NAMES[:n], KINDS[:n]
    codes: dict[str, np.ndarray] = {}
    dicts: dict[str, pa.Array] = {}
    for col in TAG_COLUMNS:
        values = [getattr(t, col) for t in tags]
        distinct = list(dict.fromkeys(v for v in values if v is not None))
        where = {v: i for i, v in enumerate(distinct)}
        codes[col] = np.array([where.get(v, -1) for v in values], dtype=np.int32)
        dicts[col] = pa.array(distinct, pa.string())
    distinct_names = list(dict.fromkeys(names))
    where_name = {v: i for i, v in enumerate(distinct_names)}
    got = SiteColumns(
        n=n,
        name_codes=np.array([where_name[v] for v in names], dtype=np.int32),
        name_dict=pa.array(distinct_names, pa.string()),
        kinds=np.array(kinds, dtype=np.int8),
        has_attributes=np.array([t.attributes is not None for t in tags], dtype=bool),
        codes=codes,
        dicts=dicts,
    )
    _cached = got
    return got
