"""The live model's array helpers against the NumPy calls they replace."""

from __future__ import annotations

import numpy as np
import pytest

from chiptrace.viewer._ring import DTYPE, add_at, unique_rows


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
