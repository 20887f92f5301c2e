"""Synthetic emulator-like span tables for benchmarks: realistic shapes, made in seconds."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa

from chiptrace.schema import batch_from_columns, ids_to_binary, trace_ids_to_binary

CHIPS = [f"gpu:{i}" for i in range(8)] + [
    "cpu:0",
    "cpu:1",
    "dpu:0",
    "dpu:1",
    "npu:0",
    "npu:1",
    "nic:0",
    "nic:1",
]
NAMES = [
    "fwd.layer",
    "bwd.layer",
    "allreduce.chunk",
    "h2d",
    "preprocess",
    "optimizer",
    "decode",
    "send",
]


def _dict(values: list[str], idx: np.ndarray) -> pa.DictionaryArray:
    return pa.DictionaryArray.from_arrays(pa.array(idx.astype(np.int32)), pa.array(values))


def emulator_like_batch(
    n: int, rng: np.random.Generator, t: int, seq: int
) -> tuple[pa.RecordBatch, int]:
    """n spans over 16 chips of six types, ~10 us each, in steps of 4096 spans."""
    chip_idx = np.arange(n) % len(CHIPS)
    dur = rng.integers(2_000, 20_000, n)
    start = t + np.cumsum(rng.integers(200, 2_000, n))
    step = (seq + np.arange(n)) // 4096
    span_ids = (np.arange(n, dtype=np.uint64) + np.uint64(seq + 1)) * np.uint64(0x9E3779B97F4A7C15)
    parent = (step.astype(np.uint64) + np.uint64(1)) * np.uint64(0xC2B2AE3D27D4EB4F)
    trace = [int(s).to_bytes(16, "big") for s in step]
    chip_types = [c.split(":")[0] for c in CHIPS]
    cols = {
        "trace_id": trace_ids_to_binary(trace),
        "span_id": ids_to_binary(span_ids),
        "parent_span_id": ids_to_binary(parent),
        "name": _dict(NAMES, chip_idx % len(NAMES)),
        "start_ns": start,
        "end_ns": start + dur,
        "chip_id": _dict(CHIPS, chip_idx),
        "chip_type": _dict(chip_types, chip_idx),
        "op_kind": _dict(["compute", "comm"], (chip_idx % 3 == 0).astype(np.int32)),
        "op_bytes": rng.integers(1, 64, n) << 20,
        "op_flops": rng.integers(1, 1000, n) << 30,
        "op_precision": _dict(["bf16", "fp8"], chip_idx % 2),
        "service": "bench",
        "host": "bench-host",
        "pid": 1,
        "resource": '{"service.name":"bench"}',
        "scope": "chiptrace.emulator",
    }
    return batch_from_columns(cols, n), int(start[-1])


def synthetic_span_dir(n: int) -> Path:
    """A trace dir of n synthetic spans, cached under the temp dir between runs."""
    from chiptrace.store import PartWriter

    d = Path(tempfile.gettempdir()) / f"chiptrace-bench-{n}"
    if (d / "spans").is_dir() and any((d / "spans").glob("*.parquet")):
        return d
    writer = PartWriter(d, manifest={"source": "benchmark"})
    rng = np.random.default_rng(7)
    t = 1_700_000_000_000_000_000
    chunk = 1_000_000
    for s in range(0, n, chunk):
        b, t = emulator_like_batch(min(chunk, n - s), rng, t, s)
        writer.write(b)
    return d
