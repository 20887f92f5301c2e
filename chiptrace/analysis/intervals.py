"""Busy time (the interval union) per chip or link direction, streamed in time chunks.

The union needs every span of a key in start order. Sorting a whole store at once (a
window over 100M link transfers) holds it all in memory; here the store is read in chunks
of start time instead, each a few million spans (Parquet row groups outside a chunk's range
are skipped by their statistics), sorted by key and start with NumPy, and the running max
of end carries from one chunk to the next. Memory is one chunk's, whatever the run's length;
the result is the same union (so the same busy ns and window bins) as one sort of it all.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from chiptrace.analysis.workloads import arrow

CHUNK_SPANS = 4_000_000  # spans per chunk, on average: ~100 MB of keys and times in NumPy
_NONE = np.iinfo(np.int64).min


def chunk_bounds(t0: int, t1: int, spans: int, chunk_spans: int | None = None) -> list[str]:
    """SQL conditions on the raw `start_ns` that split [t0, t1] into time chunks of about
    `chunk_spans` spans each (even spread assumed); the first and last are open-ended so
    every span falls in exactly one."""
    k = max(-(-max(spans, 1) // (chunk_spans or CHUNK_SPANS)), 1)
    width = (t1 - t0) // k + 1
    edges = [t0 + i * width for i in range(1, k)]
    lows = [None, *edges]
    highs = [*edges, None]
    out = []
    for a, b in zip(lows, highs, strict=True):
        parts = ([f"start_ns >= {a}"] if a is not None else []) + (
            [f"start_ns < {b}"] if b is not None else []
        )
        out.append(" AND ".join(parts) or "true")
    return out


@dataclass
class Union:
    """Running interval union per key (a 64-bit hash of the key's columns).

    Feed it chunks in order of start time (`add`); `busy` then holds each key's union
    length, and, when windows were asked for, `bins` its busy ns per window.
    """

    t0: int = 0
    window_ns: int = 0  # 0: no windows
    n_windows: int = 0
    index: dict[int, int] = field(default_factory=dict)
    carry: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    busy: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    bins: np.ndarray = field(default_factory=lambda: np.zeros((0, 0), np.int64))

    def _rows(self, keys: np.ndarray) -> np.ndarray:
        rows = np.fromiter(
            (self.index.setdefault(int(k), len(self.index)) for k in keys), np.int64, len(keys)
        )
        grow = len(self.index) - len(self.carry)
        if grow > 0:
            self.carry = np.concatenate([self.carry, np.full(grow, _NONE, np.int64)])
            self.busy = np.concatenate([self.busy, np.zeros(grow, np.int64)])
            if self.n_windows:
                pad = np.zeros((grow, self.n_windows), np.int64)
                self.bins = np.concatenate([self.bins, pad])
        return rows

    def add(
        self, key: np.ndarray, start: np.ndarray, end: np.ndarray, ordered: bool = False
    ) -> None:
        """One chunk: every span whose start falls in it (ends may run past it); `ordered`:
        already sorted by key, then start."""
        if not len(key):
            return
        if not ordered:
            order = np.lexsort((start, key))
            key, start, end = key[order], start[order], end[order]
        first = np.empty(len(key), bool)
        first[0] = True
        np.not_equal(key[1:], key[:-1], out=first[1:])
        heads = np.flatnonzero(first)
        gid = np.cumsum(first) - 1
        rows = self._rows(key[heads])
        # Running max of end within each key: shift each key's values above the previous
        # key's, so one cumulative max over the chunk never crosses a key boundary.
        base = int(start.min())
        rel = end - base
        span = int(rel.max()) + 1
        if span * len(heads) < (1 << 62):
            lift = gid * span
            cummax = np.maximum.accumulate(rel + lift) - lift + base
        else:  # times too far apart to lift: one key at a time
            cummax = np.concatenate(
                [np.maximum.accumulate(end[a:b]) for a, b in zip(heads, [*heads[1:], len(end)])]
            )
        before = np.empty_like(cummax)
        before[1:] = cummax[:-1]
        before[heads] = _NONE
        np.maximum(before, self.carry[rows][gid], out=before)
        piece = np.maximum(start, before)  # the part of each span no earlier span covered
        adds = np.maximum(end - piece, 0)
        self.busy[rows] += np.add.reduceat(adds, heads)
        self.carry[rows] = np.maximum(self.carry[rows], np.maximum.reduceat(end, heads))
        if self.n_windows:
            self._bin(rows[gid], piece, end)

    def _bin(self, row: np.ndarray, s: np.ndarray, e: np.ndarray) -> None:
        keep = e > s
        row, s, e = row[keep], s[keep], e[keep]
        w, t0 = self.window_ns, self.t0
        k0 = (s - t0) // w
        k1 = (e - 1 - t0) // w
        one = k0 == k1
        self._put(row[one], k0[one], e[one] - s[one])
        many = ~one
        if many.any():  # pieces across window edges (few): one row per window touched
            n = (k1 - k0 + 1)[many]
            r, a, b = np.repeat(row[many], n), np.repeat(s[many], n), np.repeat(e[many], n)
            k = np.repeat(k0[many], n) + (np.arange(n.sum()) - np.repeat(np.cumsum(n) - n, n))
            d = np.minimum(b, t0 + (k + 1) * w) - np.maximum(a, t0 + k * w)
            self._put(r, k, d)

    def _put(self, row: np.ndarray, k: np.ndarray, d: np.ndarray) -> None:
        ok = (k >= 0) & (k < self.n_windows)
        np.add.at(self.bins, (row[ok], k[ok]), d[ok])

    def busy_of(self, key: int) -> int:
        """Union length of one key (0 if it had no span)."""
        i = self.index.get(int(key))
        return 0 if i is None else int(self.busy[i])


def stream_union(
    con: Any,
    select_chunk: str,
    conditions: list[str],
    *,
    t0: int = 0,
    window_ns: int = 0,
    n_windows: int = 0,
) -> Union:
    """Run `select_chunk` (SQL with a `{chunk}` placeholder for a condition on the raw
    start_ns, returning columns k UBIGINT, s BIGINT, e BIGINT) once per condition, in time
    order, and fold each result into one `Union`. DuckDB sorts each chunk (on every core;
    NumPy's lexsort takes one and twice as long)."""
    u = Union(t0=t0, window_ns=window_ns, n_windows=n_windows)
    u.bins = np.zeros((0, n_windows), np.int64)
    for cond in conditions:
        table = arrow(con, f"SELECT * FROM ({select_chunk.replace('{chunk}', cond)}) ORDER BY k, s")
        if not table.num_rows:
            continue
        u.add(_np(table["k"]).astype(np.uint64), _np(table["s"]), _np(table["e"]), ordered=True)
    return u


def _np(col: pa.ChunkedArray) -> np.ndarray:
    return col.combine_chunks().to_numpy(zero_copy_only=False)
