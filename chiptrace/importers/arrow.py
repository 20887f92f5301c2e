"""Arrow arrays from NumPy arrays and Python values, built from buffers; compute kernels.

`pa.array()` and `pa.scalar()` import pandas, when it is installed, to ask whether their
input is a pandas object (pyarrow's lazy pandas shim): ~0.5 s of a short import's start-up
and ~60 MB of memory, for nothing. The importers build every array they make here instead,
from NumPy buffers (zero-copy for numbers) and joined bytes (strings). Kernels are called
by name (`call`), since importing pyarrow.compute (which `Array.cast` and `.take` do)
generates a Python wrapper for each of its functions: ~0.13 s, a tenth of a small import.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

try:  # the compute kernels without pyarrow.compute's 300 generated wrappers (~0.13 s)
    from pyarrow._compute import SliceOptions, call_function
except ImportError:  # pragma: no cover - a pyarrow that moved them
    from pyarrow.compute import SliceOptions, call_function

_TYPES = {
    np.dtype(np.int8): pa.int8(),
    np.dtype(np.int32): pa.int32(),
    np.dtype(np.int64): pa.int64(),
    np.dtype(np.uint64): pa.uint64(),
    np.dtype(np.float64): pa.float64(),
}


def bitmap(valid: np.ndarray | None) -> pa.Buffer | None:
    """A validity bitmap from a bool mask, or None when every value is valid."""
    if valid is None or valid.all():
        return None
    return pa.py_buffer(np.packbits(valid, bitorder="little"))


def numeric(values: np.ndarray, valid: np.ndarray | None = None) -> pa.Array:
    """An int8/int32/int64/uint64/float64 array sharing `values`' memory; nulls where not valid."""
    values = np.ascontiguousarray(values)
    type_ = _TYPES[values.dtype]
    return pa.Array.from_buffers(type_, len(values), [bitmap(valid), pa.py_buffer(values)])


def booleans(values: np.ndarray) -> pa.BooleanArray:
    return pa.Array.from_buffers(
        pa.bool_(), len(values), [None, pa.py_buffer(np.packbits(values, bitorder="little"))]
    )


def binary_from(data: bytes, lengths: np.ndarray, type_: pa.DataType | None = None) -> pa.Array:
    """A binary (or string) array of consecutive pieces of `data` with these lengths."""
    offsets = np.zeros(len(lengths) + 1, np.int32)
    np.cumsum(lengths, out=offsets[1:])
    return pa.Array.from_buffers(
        type_ or pa.binary(), len(lengths), [None, pa.py_buffer(offsets), pa.py_buffer(data)]
    )


def strings(values: Sequence[str | None]) -> pa.StringArray:
    """A string array from Python strings (None for null)."""
    encoded = [b"" if v is None else v.encode("utf-8", "surrogatepass") for v in values]
    arr = binary_from(b"".join(encoded), np.fromiter(map(len, encoded), np.int32, len(encoded)))
    valid = np.fromiter((v is not None for v in values), bool, len(values))
    out = pa.Array.from_buffers(pa.string(), len(values), [bitmap(valid), *arr.buffers()[1:]])
    return out


def scalar(value: str | None) -> pa.Scalar:
    """A string scalar (the argument of a compute function), or a null string."""
    return strings([value])[0]


def dictionary(
    codes: np.ndarray, values: Sequence[str | None], valid: np.ndarray | None = None
) -> pa.DictionaryArray:
    """dictionary<int32, string>: values[codes], null where not valid."""
    codes = np.asarray(codes)
    indices = numeric(
        np.where(valid, codes, 0).astype(np.int32)
        if valid is not None
        else codes.astype(np.int32, copy=False),
        valid,
    )
    return pa.DictionaryArray.from_arrays(indices, strings(values))


def constant(value: str, n: int) -> pa.DictionaryArray:
    """n rows of one string, as a dictionary column."""
    return dictionary(np.zeros(n, np.int32), [value])


def encode(values: Iterable[Any], n: int) -> tuple[np.ndarray, list[Any]]:
    """(int32 codes, distinct values in first-seen order) of n hashable values, in C
    loops: each value is stored with its first position, and positions become codes."""
    first: dict[Any, int] = {}
    pos = np.fromiter(map(first.setdefault, values, itertools.count()), np.int64, n)
    seen = np.fromiter(first.values(), np.int64, len(first))
    return np.searchsorted(seen, pos).astype(np.int32), list(first)


def call(name: str, *args: Any, options: Any = None) -> Any:
    """The Arrow compute function `name` on args (arrays or scalars)."""
    return call_function(name, list(args), options)


def slice_from(arr: pa.Array, start: int) -> pa.Array:
    """Each string from code unit `start` on."""
    return call("utf8_slice_codeunits", arr, options=SliceOptions(start))


def take(arr: pa.Array, indices: np.ndarray) -> pa.Array:
    return call("take", arr, numeric(indices))


def to_numpy(arr: pa.Array, dtype: Any) -> np.ndarray:
    """The values of a null-free primitive array (Array.to_numpy imports pandas)."""
    buf = arr.buffers()[1]
    return np.frombuffer(buf, dtype)[arr.offset : arr.offset + len(arr)]
