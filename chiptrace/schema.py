"""The span schema: the one table every stage reads and writes (see docs/schema.md).

A chiptrace span is an OpenTelemetry span plus typed columns for the chip or link it ran
on. This module owns the Arrow schema of a Parquet part and the conversions into it;
nothing else defines columns. The vocabularies (chip types, link types, op kinds,
precisions), span `Tags` and the attribute map live in chiptrace.vocab, which needs no
Arrow (the instrumentation path imports only that), and are re-exported here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pyarrow as pa

from chiptrace.errors import ChipError
from chiptrace.vocab import (
    ATTRIBUTE_COLUMNS,
    CHIP_TYPES,
    COLUMN_ATTRIBUTES,
    LINK_TYPES,
    LOCAL_CHIP_TYPES,
    NO_TAGS,
    OP_KINDS,
    PRECISIONS,
    SCHEMA_VERSION,
    SCHEMA_VERSION_KEY,
    SPAN_KIND_CLIENT,
    SPAN_KIND_CONSUMER,
    SPAN_KIND_INTERNAL,
    SPAN_KIND_PRODUCER,
    SPAN_KIND_SERVER,
    SPAN_KIND_UNSPECIFIED,
    STATUS_ERROR,
    STATUS_OK,
    STATUS_UNSET,
    TAG_COLUMNS,
    Chip,
    Link,
    Tags,
    check_choice,
    chip_type_of,
    dumps,
    parse_chip,
    parse_link,
)

__all__ = [
    "ATTRIBUTE_COLUMNS",
    "CHIP_TYPES",
    "COLUMN_ATTRIBUTES",
    "LINK_TYPES",
    "LOCAL_CHIP_TYPES",
    "NO_TAGS",
    "OP_KINDS",
    "PRECISIONS",
    "SCHEMA_VERSION",
    "SCHEMA_VERSION_KEY",
    "SPAN_KIND_CLIENT",
    "SPAN_KIND_CONSUMER",
    "SPAN_KIND_INTERNAL",
    "SPAN_KIND_PRODUCER",
    "SPAN_KIND_SERVER",
    "SPAN_KIND_UNSPECIFIED",
    "STATUS_ERROR",
    "STATUS_OK",
    "STATUS_UNSET",
    "TAG_COLUMNS",
    "Chip",
    "Link",
    "Tags",
    "check_choice",
    "chip_type_of",
    "dumps",
    "parse_chip",
    "parse_link",
]

_DICT = pa.dictionary(pa.int32(), pa.string())

SPAN_SCHEMA = pa.schema(
    [
        pa.field("trace_id", pa.binary(16), nullable=False),
        pa.field("span_id", pa.binary(8), nullable=False),
        pa.field("parent_span_id", pa.binary(8)),
        pa.field("name", _DICT, nullable=False),
        pa.field("kind", pa.int8(), nullable=False),
        pa.field("start_ns", pa.int64(), nullable=False),
        pa.field("end_ns", pa.int64(), nullable=False),
        pa.field("status_code", pa.int8(), nullable=False),
        pa.field("status_message", pa.string()),
        pa.field("chip_id", _DICT),
        pa.field("chip_type", _DICT),
        pa.field("link_id", _DICT),
        pa.field("link_type", _DICT),
        pa.field("link_src", _DICT),
        pa.field("link_dst", _DICT),
        pa.field("op_kind", _DICT),
        pa.field("op_bytes", pa.int64()),
        pa.field("op_flops", pa.int64()),
        pa.field("op_precision", _DICT),
        pa.field("service", _DICT),
        pa.field("host", _DICT),
        pa.field("pid", pa.int32()),
        pa.field("scope", _DICT),
        pa.field("resource", _DICT),
        pa.field("attributes", pa.string()),
        pa.field("events", pa.string()),
        pa.field("links", pa.string()),
    ],
    metadata={SCHEMA_VERSION_KEY: str(SCHEMA_VERSION).encode()},
)
COLUMNS = tuple(SPAN_SCHEMA.names)
DICT_COLUMNS = tuple(f.name for f in SPAN_SCHEMA if pa.types.is_dictionary(f.type))


def ids_to_binary(ids: Any, zero_is_null: bool = False) -> pa.FixedSizeBinaryArray:
    """8-byte big-endian ids (the OTLP byte order) from unsigned 64-bit integers.

    Args:
        ids: a sequence or NumPy array of unsigned integers.
        zero_is_null: an id of 0 means "none" (a root span's parent) and becomes null.
    """
    arr = np.asarray(ids, dtype=np.uint64)
    buf = pa.py_buffer(arr.astype(">u8").tobytes())
    validity = None
    if zero_is_null:
        valid = arr != 0
        if not valid.all():
            validity = pa.py_buffer(np.packbits(valid, bitorder="little").tobytes())
    return pa.FixedSizeBinaryArray.from_buffers(pa.binary(8), len(arr), [validity, buf])


def trace_ids_to_binary(ids: Any) -> pa.FixedSizeBinaryArray:
    """16-byte trace ids from a sequence of 16-byte `bytes` values."""
    ids = list(ids)
    buf = pa.py_buffer(b"".join(ids))
    return pa.FixedSizeBinaryArray.from_buffers(pa.binary(16), len(ids), [None, buf])


def constant_dict(value: str | None, n: int) -> pa.DictionaryArray:
    """A dictionary column holding one value n times: costs n int32s, not n strings."""
    if value is None:
        return pa.nulls(n, _DICT)
    return pa.DictionaryArray.from_arrays(
        pa.array(np.zeros(n, dtype=np.int32)), pa.array([value], pa.string())
    )


def _as_column(name: str, values: Any, n: int) -> pa.Array:
    field = SPAN_SCHEMA.field(name)
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    if isinstance(values, pa.Array):
        if values.type == field.type:
            return values
        if pa.types.is_dictionary(field.type):
            if pa.types.is_dictionary(values.type):
                return values.cast(field.type)
            return values.cast(pa.string()).dictionary_encode().cast(field.type)
        return values.cast(field.type)
    if isinstance(values, (str, int)) or values is None:
        if pa.types.is_dictionary(field.type):
            return constant_dict(None if values is None else str(values), n)
        return pa.array(np.full(n, values) if values is not None else [None] * n, field.type)
    return pa.array(values, field.type)  # dictionary types too: one pass, no string array


def batch_from_columns(columns: Mapping[str, Any], n: int | None = None) -> pa.RecordBatch:
    """Build a span RecordBatch from whole columns: the bulk path the emulator uses.

    Args:
        columns: column name -> Arrow array, NumPy array, list, or one scalar for the
            whole column. Missing nullable columns become nulls.
        n: number of rows; inferred from the first non-scalar column when omitted.

    Raises:
        ChipError: an unknown column, a missing required column, or ragged lengths.
    """
    unknown = set(columns) - set(COLUMNS)
    if unknown:
        raise ChipError(f"unknown span column(s) {sorted(unknown)}; expected {', '.join(COLUMNS)}")
    if n is None:
        n = next((len(v) for v in columns.values() if not isinstance(v, (str, int, type(None)))), 0)
    arrays = []
    for field in SPAN_SCHEMA:
        if field.name in columns:
            arr = _as_column(field.name, columns[field.name], n)
        elif field.name in ("kind",):
            arr = pa.array(np.full(n, SPAN_KIND_INTERNAL, dtype=np.int8))
        elif field.name == "status_code":
            arr = pa.array(np.zeros(n, dtype=np.int8))
        elif not field.nullable:
            raise ChipError(f"span column {field.name!r} is required")
        else:
            arr = pa.nulls(n, field.type)
        if len(arr) != n:
            raise ChipError(f"span column {field.name!r} has {len(arr)} rows, expected {n}")
        arrays.append(arr)
    return pa.RecordBatch.from_arrays(arrays, schema=SPAN_SCHEMA)


def empty_batch() -> pa.RecordBatch:
    """A span batch with no rows, for readers that must return the schema anyway."""
    return pa.RecordBatch.from_pylist([], schema=SPAN_SCHEMA)


# Host metrics (chiptrace.host): samples in long format, one row per (time, chip, metric),
# in DIR/metrics beside the spans; docs/host.md names every metric. Strings are plain, not
# dictionaries: dictionary-encoding a few hundred rows in Arrow costs ~1 ms a column, ten
# times the sampling itself, and Parquet dictionary-encodes them on disk anyway.
METRICS_TABLE = "metrics"
METRICS_SCHEMA_VERSION = 1
METRICS_SCHEMA_VERSION_KEY = b"chiptrace.metrics_schema_version"

SOURCE_REAL = "real"
SOURCE_EMULATED = "emulated"

METRICS_SCHEMA = pa.schema(
    [
        pa.field("ts_ns", pa.int64(), nullable=False),
        pa.field("host", pa.string(), nullable=False),
        pa.field("chip_id", pa.string()),
        pa.field("chip_type", pa.string()),
        pa.field("device", pa.string()),
        pa.field("metric", pa.string(), nullable=False),
        pa.field("value", pa.float64(), nullable=False),
        pa.field("unit", pa.string(), nullable=False),
        pa.field("source", pa.string(), nullable=False),
        pa.field("run_id", pa.string()),
        pa.field("pid", pa.int32()),
    ],
    metadata={METRICS_SCHEMA_VERSION_KEY: str(METRICS_SCHEMA_VERSION).encode()},
)
METRIC_COLUMNS = tuple(METRICS_SCHEMA.names)

# Samples repeat hosts, chips and metric names and carry increasing times.
METRICS_WRITE_OPTIONS: dict[str, Any] = {
    "compression": "zstd",
    "compression_level": 3,
    "use_dictionary": [c for c in METRIC_COLUMNS if c not in ("ts_ns", "value", "pid")],
    "column_encoding": {"ts_ns": "DELTA_BINARY_PACKED"},
    "write_statistics": ["ts_ns", "chip_id", "chip_type", "metric"],
}
