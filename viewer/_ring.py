"""Storage under the live model: rows of accumulators on a ring of time buckets, one row per
chip or link direction, and the helpers that turn Arrow columns and ids into row keys.

No drawing and no Textual here (model.py's rule), only NumPy and Arrow.
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


def strings(col: pa.Array | pa.ChunkedArray) -> tuple[np.ndarray, list[str | None]]:
    """(codes with -1 for null, dictionary values) of a string or dictionary column."""
    if isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks()
    if not pa.types.is_dictionary(col.type):
        col = col.dictionary_encode()
    codes = col.indices.fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)
    return codes, col.dictionary.to_pylist()


def ints(col: pa.Array | pa.ChunkedArray, fill: int | None = None) -> np.ndarray:
    if fill is not None:
        col = col.fill_null(fill)
    return (
        col.to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
        if isinstance(col, pa.Array)
        else np.asarray(col.to_numpy(), dtype=np.int64)
    )


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
