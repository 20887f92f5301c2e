"""The live model's array helpers against the NumPy calls they replace."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from chiptrace.viewer._ring import DTYPE, add_at, numbers, pieces, unique_rows


@pytest.mark.parametrize("sizes", [(50, 20, 20), (3000, 3000, 3000)])  # table, then 1-D sort
def test_unique_rows_is_numpys_unique_of_rows(sizes: tuple[int, int, int]) -> None:
    rng = np.random.default_rng(7)
    a, b, c = (rng.integers(-1, n, 20_000) for n in sizes)
    a = np.abs(a)  # the link id itself is never null here
    triples, first, inverse = unique_rows(a, b, c, sizes)
    want, want_inverse = np.unique(np.stack([a, b, c], axis=1), axis=0, return_inverse=True)
    assert np.array_equal(triples, want)
    assert np.array_equal(inverse, want_inverse.ravel())
    assert np.array_equal(np.stack([a, b, c], axis=1)[first], triples)  # one row of each


@pytest.mark.parametrize(
    ("n", "width"),
    [(10, 64), (100_000, 64), (20_000, 3)],  # a flat add.at, then a bincount of all or a block
)
def test_add_at_is_numpys_add_at(n: int, width: int) -> None:
    rng = np.random.default_rng(8)
    rows, cols = rng.integers(0, 40, n), rng.integers(0, width, n) + (64 - width) // 2
    vals = rng.random(n) * 1000
    got, want = np.zeros((40, 64), DTYPE), np.zeros((40, 64), DTYPE)
    add_at(got, rows, cols, vals)
    np.add.at(want, (rows, cols), vals)
    assert np.allclose(got, want, rtol=1e-5)
    assert got.sum() == pytest.approx(vals.sum(), rel=1e-5)


def test_pieces_cut_spans_at_bucket_edges() -> None:
    rng = np.random.default_rng(9)
    n, b, nb = 2_000, 100, 16
    rows = rng.integers(0, 5, n)
    s = rng.integers(0, 30 * b, n)
    e = s + rng.choice([0, 1, 50, 99, 100, 250, 2_000], n)  # none, one bucket, several
    e = np.minimum(e, 30 * b)  # the newest bucket is 29 (the model advances to it first)
    lo = 14 * b  # the ring holds buckets 14..29: earlier time is dropped
    got = np.zeros((5, nb))
    r, slots, over, src = pieces(rows, s, e, b, nb, lo)
    np.add.at(got, (r, slots), over)
    want = np.zeros((5, nb))
    for row, a, z in zip(rows, s, e, strict=True):
        for k in range(14, 30):  # brute force: each span's overlap with each held bucket
            want[row, k % nb] += max(0, min(z, (k + 1) * b) - max(a, k * b))
    assert np.allclose(got, want)
    assert np.array_equal(rows[src], r) and (e[src] > s[src]).all()


@pytest.mark.parametrize(
    "arr",
    [
        pa.array(range(-5, 20), pa.int64()).slice(3, 10),
        pa.array([3, None, 7, 1, None, 2] * 4, pa.int32()).slice(1, 17),
        pa.array([1, 2, 300], pa.uint16()),
        pa.array([True, None, False, True, True, None, False, True, False] * 3).slice(2, 20),
        pa.array([], pa.int64()),
        pa.chunked_array([pa.array([1, None], pa.int64()), pa.array([3], pa.int64())]),
    ],
)
def test_numbers_read_from_the_buffers_as_to_numpy_does(arr: pa.Array | pa.ChunkedArray) -> None:
    fill = 0 if pa.types.is_boolean(arr.type) else -1
    want = [fill if v is None else v for v in arr.to_pylist()]
    assert numbers(arr, fill=fill).tolist() == want
