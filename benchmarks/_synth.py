"""A synthetic training trace of any size, built with NumPy: spans shaped like the emulator's.

Each step is one trace: a root span, phase spans (data, forward, backward, allreduce,
optimizer), DPU preprocessing, per-layer compute on 8 GPUs, a ring all-reduce over NVLink
(one transfer per GPU per chunk) and the optimizer on a CPU. gpu:5 runs 30% slower, so the
analysis has a straggler to find. About 800 spans a step.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa

from chiptrace.schema import batch_from_columns, ids_to_binary
from chiptrace.store import PartWriter

GPUS, LAYERS, CHUNKS = 8, 40, 12
T0 = 1_700_000_000_000_000_000
_DICT = pa.dictionary(pa.int32(), pa.string())


def _dict(codes: np.ndarray, values: list[str | None]) -> pa.DictionaryArray:
    mask = codes < 0
    idx = pa.array(np.where(mask, 0, codes).astype(np.int32), mask=mask)
    return pa.DictionaryArray.from_arrays(idx, pa.array(values, pa.string()))


def _template() -> dict[str, np.ndarray]:
    """One step: arrays of start/end offsets (ns), parent index, names, chips, links."""
    rows: list[tuple] = []  # (name, parent, start, end, chip, link, op, bytes, flops)

    def add(*r: object) -> int:
        rows.append(r)
        return len(rows) - 1

    layer_ns = 60_000
    fwd0, bwd0 = 200_000, 200_000 + LAYERS * layer_ns
    ar0 = bwd0 + 2 * LAYERS * layer_ns
    opt0 = ar0 + CHUNKS * 2 * 25_000
    end = opt0 + 300_000
    root = add("train_step", -1, 0, end, None, None, None, 0, 0)
    data = add("data", root, 0, 200_000, None, None, None, 0, 0)
    fwd = add("forward", root, fwd0, bwd0, None, None, None, 0, 0)
    bwd = add("backward", root, bwd0, ar0, None, None, None, 0, 0)
    ar = add("allreduce", root, ar0, opt0, None, None, None, 0, 0)
    opt = add("optimizer", root, opt0, end, None, None, None, 0, 0)
    for d in range(2):
        add("preprocess", data, 0, 180_000, f"dpu:{d}", None, "compute", 8 << 20, 0)
    for g in range(GPUS):
        slow = 1.3 if g == 5 else 1.0
        for lyr in range(LAYERS):
            s = fwd0 + lyr * layer_ns
            add(
                "matmul_fwd",
                fwd,
                s,
                s + int(layer_ns * 0.9 * slow),
                f"gpu:{g}",
                None,
                "compute",
                64 << 20,
                4 << 30,
            )
            s = bwd0 + lyr * 2 * layer_ns
            add(
                "matmul_bwd",
                bwd,
                s,
                s + int(2 * layer_ns * 0.9 * slow),
                f"gpu:{g}",
                None,
                "compute",
                128 << 20,
                8 << 30,
            )
        for c in range(CHUNKS):
            s = ar0 + c * 50_000
            add(
                "ring_send",
                ar,
                s,
                s + 45_000,
                None,
                f"nvlink6:gpu:{g}-gpu:{(g + 1) % GPUS}",
                "comm",
                32 << 20,
                0,
            )
    for c in range(4):
        add(
            "adam",
            opt,
            opt0 + c * 70_000,
            opt0 + (c + 1) * 70_000,
            "cpu:0",
            None,
            "compute",
            16 << 20,
            1 << 28,
        )
    cols = list(zip(*rows))
    return {
        "name": np.array(cols[0], dtype=object),
        "parent": np.array(cols[1]),
        "start": np.array(cols[2], dtype=np.int64),
        "end": np.array(cols[3], dtype=np.int64),
        "chip": np.array(cols[4], dtype=object),
        "link": np.array(cols[5], dtype=object),
        "op": np.array(cols[6], dtype=object),
        "bytes": np.array(cols[7], dtype=np.int64),
        "flops": np.array(cols[8], dtype=np.int64),
    }


def _codes(values: np.ndarray) -> tuple[np.ndarray, list[str | None]]:
    uniq = sorted({v for v in values if v is not None})
    index = {v: i for i, v in enumerate(uniq)}
    return np.array([index.get(v, -1) if v is not None else -1 for v in values]), list(uniq)


def _batch(
    t: dict, codes: dict, steps: np.ndarray, rng: np.random.Generator, step_len: int
) -> pa.RecordBatch:
    n_t, n_s = len(t["start"]), len(steps)
    base = np.repeat(steps * step_len, n_t) + T0
    jitter = np.repeat(rng.integers(0, 20_000, n_s), n_t)
    start = base + np.tile(t["start"], n_s) + jitter * (np.tile(t["parent"], n_s) >= 0)
    dur = np.tile(t["end"] - t["start"], n_s)
    end = start + dur
    span_ids = (np.repeat(steps, n_t) * n_t + np.tile(np.arange(n_t), n_s) + 1).astype(np.uint64)
    par = np.tile(t["parent"], n_s)
    parent_ids = np.where(par >= 0, np.repeat(steps, n_t) * n_t + par + 1, 0).astype(np.uint64)
    tid = np.zeros((n_s * n_t, 2), dtype=">u8")
    tid[:, 1] = np.repeat(steps + 1, n_t)
    trace = pa.FixedSizeBinaryArray.from_buffers(
        pa.binary(16), n_s * n_t, [None, pa.py_buffer(tid.tobytes())]
    )
    cols = {
        "trace_id": trace,
        "span_id": ids_to_binary(span_ids),
        "parent_span_id": ids_to_binary(parent_ids, zero_is_null=True),
        "start_ns": start,
        "end_ns": end,
        "op_bytes": np.tile(t["bytes"], n_s),
        "op_flops": np.tile(t["flops"], n_s),
    }
    for col, (c, vals) in codes.items():
        cols[col] = _dict(np.tile(c, n_s), vals)
    return batch_from_columns(cols, n=n_s * n_t)


def make_trace(directory: Path, n_spans: int, seed: int = 0, part_spans: int = 1_000_000) -> int:
    """Write about `n_spans` spans (whole steps) under `directory`; returns the span count."""
    t = _template()
    chip = t["chip"]
    link = t["link"]
    codes = {
        "name": _codes(t["name"]),
        "chip_id": _codes(chip),
        "chip_type": _codes(np.array([c.split(":")[0] if c else None for c in chip], dtype=object)),
        "link_id": _codes(link),
        "link_type": _codes(
            np.array([lk.split(":")[0] if lk else None for lk in link], dtype=object)
        ),
        "link_src": _codes(
            np.array(
                [lk.split(":", 1)[1].split("-")[0] if lk else None for lk in link], dtype=object
            )
        ),
        "link_dst": _codes(
            np.array([lk.split("-")[1] if lk else None for lk in link], dtype=object)
        ),
        "op_kind": _codes(t["op"]),
        "op_precision": _codes(
            np.array(["bf16" if c and c.startswith("gpu") else None for c in chip], dtype=object)
        ),
    }
    n_t = len(t["start"])
    n_steps = max(1, n_spans // n_t)
    step_len = int(t["end"][0]) + 50_000
    topo = {
        "chips": [
            {
                "id": f"gpu:{g}",
                "type": "gpu",
                "peak_flops": {"bf16": 2.5e15, "fp16": 2.5e15, "fp8": 5e15},
                "memory_bandwidth_Bps": 8e12,
            }
            for g in range(GPUS)
        ],
        "links": [
            {
                "id": f"nvlink6:gpu:{g}-gpu:{(g + 1) % GPUS}",
                "type": "nvlink6",
                "bandwidth_Bps": 1.8e12,
                "latency_ns": 2500,
            }
            for g in range(GPUS)
        ],
    }
    writer = PartWriter(
        directory, manifest={"run_id": "synthetic", "source": "bench", "topology": topo}
    )
    rng = np.random.default_rng(seed)
    per_part = max(1, part_spans // n_t)
    for first in range(0, n_steps, per_part):
        steps = np.arange(first, min(first + per_part, n_steps), dtype=np.int64)
        writer.write(_batch(t, codes, steps, rng, step_len))
    writer.write_manifest()
    return n_steps * n_t
