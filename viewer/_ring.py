"""Storage under the live model: rows of accumulators on a ring of time buckets, one row per
chip or link direction, and the helpers that turn Arrow columns and ids into row keys.

No drawing and no Textual here (live_model.py's rule), only NumPy and Arrow.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pyarrow as pa

# float32: a 10 ms bucket's busy ns (< 2**24) stay exact, and an nvl72 rack's 2,900 link
# directions x 4096 buckets x (busy, bytes) take ~100 MB instead of ~400 MB.
DTYPE = np.float32


class Ring:
    """Rows of accumulators over a ring of time buckets; grows a row per new key."""

    def __init__(self, n_buckets: int) -> None:
        self.keys: dict[Any, int] = {}
        self.meta: list[dict[str, Any]] = []
        self.busy = np.zeros((0, n_buckets), DTYPE)
        self.bytes = np.zeros((0, n_buckets), DTYPE)

    def reserve(self, rows: int) -> None:
        """Room for `rows` rows at once (a declared topology's chips or link directions):
        growing by half, row by row, copies an nvl72 rack's accumulators ~5 times over."""
        more = rows - self.busy.shape[0]
        if more > 0 and not self.busy.shape[0]:
            # Fresh zeros are mapped lazily; a copy (vstack) would touch every page at once.
            self.busy = np.zeros((rows, self.busy.shape[1]), DTYPE)
            self.bytes = np.zeros((rows, self.busy.shape[1]), DTYPE)
        elif more > 0:
            pad = np.zeros((more, self.busy.shape[1]), DTYPE)
            self.busy = np.vstack([self.busy, pad])
            self.bytes = np.vstack([self.bytes, pad])

    def row(self, key: Any, **meta: Any) -> int:
        r = self.keys.get(key)
        if r is None:
            r = self.keys[key] = len(self.meta)
            self.meta.append(dict(meta))
            if r >= self.busy.shape[0]:  # grow by half: amortized O(1) per new key
                grow = max(8, self.busy.shape[0] // 2)
                pad = np.zeros((grow, self.busy.shape[1]), DTYPE)
                self.busy = np.vstack([self.busy, pad])
                self.bytes = np.vstack([self.bytes, pad])
        else:
            for k, v in meta.items():
                if v is not None and self.meta[r].get(k) is None:
                    self.meta[r][k] = v
        return r


def _bits(buf: pa.Buffer, offset: int, n: int) -> np.ndarray:
    """n bits of an Arrow bitmap (least significant bit first) as booleans."""
    return np.unpackbits(np.frombuffer(buf, np.uint8), bitorder="little")[
        offset : offset + n
    ].astype(bool)


def numbers(col: pa.Array | pa.ChunkedArray, fill: int | None = None) -> np.ndarray:
    """An integer or boolean Arrow column as NumPy, read from its buffers, nulls as `fill`.

    pyarrow's to_numpy (and any Python value made an Arrow scalar: fill_null(-1), take of a
    list) imports pandas, ~0.14 s once a process, which a viewer's first frame would wait
    for. Another type, or nulls without `fill`, goes through to_numpy."""
    if isinstance(col, pa.ChunkedArray):
        if col.num_chunks == 1:
            return numbers(col.chunk(0), fill)
        return np.concatenate([numbers(c, fill) for c in col.chunks] or [np.zeros(0, np.int64)])
    t, n = col.type, len(col)
    if not (pa.types.is_integer(t) or pa.types.is_boolean(t)) or (col.null_count and fill is None):
        return col.to_numpy(zero_copy_only=False)
    if not n:
        return np.zeros(0, bool if pa.types.is_boolean(t) else np.int64)
    validity, data = col.buffers()[:2]
    if pa.types.is_boolean(t):
        out = _bits(data, col.offset, n)
    else:
        dtype = np.dtype(f"{'i' if pa.types.is_signed_integer(t) else 'u'}{t.bit_width // 8}")
        out = np.frombuffer(data, dtype, count=n, offset=col.offset * dtype.itemsize)
    if col.null_count:
        out = np.where(_bits(validity, col.offset, n), out, fill or 0)
    return out


def strings(col: pa.Array | pa.ChunkedArray) -> tuple[np.ndarray, list[str | None]]:
    """(codes with -1 for null, dictionary values) of a string or dictionary column."""
    if isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks()
    if not pa.types.is_dictionary(col.type):
        col = col.dictionary_encode()
    return numbers(col.indices, fill=-1).astype(np.int64), col.dictionary.to_pylist()


def ints(col: pa.Array | pa.ChunkedArray, fill: int | None = None) -> np.ndarray:
    return numbers(col, fill).astype(np.int64, copy=False)


def direction_key(link_id: str, link_type: str, src: str | None, dst: str | None) -> str:
    """The row key of one link direction: the link id when it already reads src-dst,
    else the id written the other way round (`nvlink6:gpu:1-gpu:0`)."""
    if src is None or dst is None:
        return link_id
    route = link_id.partition(":")[2]
    if route in (f"{src}-{dst}", f"{src}->{dst}"):
        return link_id
    if route in (f"{dst}-{src}", f"{dst}->{src}"):
        return f"{link_type}:{src}-{dst}"
    return f"{link_id} ({src}>{dst})"


def natural(key: str) -> tuple:
    """gpu:2 before gpu:10."""
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", key))


def add_at(acc: np.ndarray, rows: np.ndarray, cols: np.ndarray, vals: np.ndarray) -> None:
    """`np.add.at(acc, (rows, cols), vals)` in a fraction of its time: a bincount over the
    block of rows and buckets the batch touches when that block is small beside the batch
    (a part of a store lies in a few buckets: ~10x np.add.at on an nvl72 rack's links),
    else one flat index into the contiguous accumulator (NumPy's fast 1-D path)."""
    if not len(rows):
        return
    if not acc.flags.c_contiguous:
        np.add.at(acc, (rows, cols), vals)
        return
    r0, c0 = int(rows.min()), int(cols.min())
    height, width = int(rows.max()) - r0 + 1, int(cols.max()) - c0 + 1
    if height * width <= 4 * len(rows):
        block = np.bincount(
            (rows - r0) * width + (cols - c0), weights=vals, minlength=height * width
        )
        acc[r0 : r0 + height, c0 : c0 + width] += block.reshape(height, width)
        return
    flat = rows * acc.shape[1] + cols
    # Same dtype and intp indices: ufunc.at's fast loop (a cast sends it to the slow one).
    np.add.at(acc.reshape(-1), flat.astype(np.intp, copy=False), vals.astype(acc.dtype))


def unique_rows(
    a: np.ndarray, b: np.ndarray, c: np.ndarray, sizes: tuple[int, int, int]
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The distinct (a, b, c) code triples (codes >= -1 below `sizes`), one position of each
    and each row's index into them: `np.unique(..., axis=0)` without its sort of rows
    (O(n) through a table when the code space is small, a 1-D sort of one key otherwise)."""
    sa, sb, sc = (n + 1 for n in sizes)
    key = ((a + 1) * sb + (b + 1)) * sc + (c + 1)
    space = sa * sb * sc
    if space <= max(1 << 22, 2 * len(key)):
        seen = np.zeros(space, dtype=bool)
        seen[key] = True
        uniq = np.flatnonzero(seen)
        index = np.empty(space, dtype=np.int64)
        index[uniq] = np.arange(len(uniq))
        inverse = index[key]
        where = np.empty(space, dtype=np.int64)
        where[key] = np.arange(len(key))  # any one position per triple
        first = where[uniq]
    else:
        uniq, first, inverse = np.unique(key, return_index=True, return_inverse=True)
    triples = np.stack([uniq // (sb * sc) - 1, (uniq // sc) % sb - 1, uniq % sc - 1], axis=1)
    return triples, first, inverse.ravel()


def pieces(
    rows: np.ndarray, s: np.ndarray, e: np.ndarray, bucket_ns: int, n_buckets: int, lo: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Spans [s, e) cut at bucket edges: (row, ring slot, overlap ns, index of its span) per
    piece, for spans of positive length that end after `lo` (the ring's oldest bucket).

    Most spans (a 35 µs transfer in a 3.6 ms bucket) lie in one bucket and stay one piece;
    only the others are repeated, once per bucket they overlap."""
    b = bucket_ns
    src = np.flatnonzero((e > lo) & (e > s))
    s, e = np.maximum(s[src], lo), e[src]
    b0 = s // b
    k = (e - 1) // b - b0 + 1
    multi = np.flatnonzero(k > 1)
    if not len(multi):
        return rows[src], b0 % n_buckets, (e - s).astype(np.float64), src
    one = np.flatnonzero(k == 1)
    km = k[multi]
    idx = np.repeat(b0[multi], km) + (np.arange(int(km.sum())) - np.repeat(np.cumsum(km) - km, km))
    over = np.minimum(np.repeat(e[multi], km), (idx + 1) * b) - np.maximum(
        np.repeat(s[multi], km), idx * b
    )
    where = src[np.concatenate([one, np.repeat(multi, km)])]
    slots = np.concatenate([b0[one], idx]) % n_buckets
    overlap = np.concatenate([e[one] - s[one], over]).astype(np.float64)
    return rows[where], slots, overlap, where
