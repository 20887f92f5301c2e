"""A synthetic rack trace with known load, written as real Parquet parts (no emulator).

Six chip types, known busy fractions, one saturated link and one idle GPU, so tests can
check the dashboard's figures against DuckDB over the same directory.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa

import chiptrace
from chiptrace.schema import batch_from_columns, ids_to_binary, trace_ids_to_binary
from chiptrace.store import PartWriter
from chiptrace.viewer.live_model import INGEST_COLUMNS

T0 = 1_700_000_000_000_000_000
STEP_NS = 100_000_000  # 100 ms steps
OP_NS = 1_000_000  # ops are 1 ms slots
# chip -> busy fraction (ops fill this share of each 1 ms slot... per step)
LOAD = {
    "gpu:0": 0.8,
    "gpu:1": 0.8,
    "gpu:2": 0.7,
    "gpu:3": 0.0,
    "cpu:0": 0.3,
    "dpu:0": 0.2,
    "npu:0": 0.5,
    "nic:0": 0.4,
    "switch:0": 0.1,
}
SATURATED = "nvlink6:gpu:0-gpu:1"
CALM = "pcie5:cpu:0-gpu:0"
TOPOLOGY = {
    "chips": [{"id": c, "type": c.split(":")[0]} for c in LOAD],
    "links": [
        {"id": SATURATED, "type": "nvlink6", "src": "gpu:0", "dst": "gpu:1", "bandwidth_Bps": 1e9},
        {"id": CALM, "type": "pcie5", "src": "cpu:0", "dst": "gpu:0", "bandwidth_Bps": 64e9},
    ],
}


def step_batch(step: int, seq: int) -> pa.RecordBatch:
    """One step: a root span, back-to-back ops per chip, transfers on both links."""
    t = T0 + step * STEP_NS
    cols: dict[str, list] = {k: [] for k in INGEST_COLUMNS}

    def add(name, s, e, chip=None, link=None, kind=None, nbytes=None):  # noqa: ANN001, ANN202
        lk = link.split(":")[0] if link else None
        src, dst = link.split(":", 1)[1].split("-") if link else (None, None)
        for k, v in (
            ("name", name),
            ("start_ns", s),
            ("end_ns", e),
            ("chip_id", chip),
            ("chip_type", chip.split(":")[0] if chip else None),
            ("link_id", link),
            ("link_type", lk),
            ("link_src", src),
            ("link_dst", dst),
            ("op_kind", kind),
            ("op_bytes", nbytes),
        ):
            cols[k].append(v)

    add("train_step", t, t + STEP_NS)
    slots = STEP_NS // OP_NS
    for chip, load in LOAD.items():
        if load <= 0:
            continue
        busy = int(OP_NS * load)
        for k in range(slots):
            s = t + k * OP_NS
            add(f"{chip.split(':')[0]}.op", s, s + busy, chip=chip, kind="compute")
    # The saturated link moves 0.95 GB/s of a 1 GB/s link: continuous 10 ms transfers.
    for k in range(10):
        s = t + k * 10_000_000
        add("allreduce", s, s + 10_000_000, link=SATURATED, kind="comm", nbytes=9_500_000)
    add("h2d", t, t + 1_000_000, link=CALM, kind="memcpy", nbytes=64_000_000)
    n = len(cols["name"])
    span_ids = np.arange(seq + 1, seq + n + 1, dtype=np.uint64)
    parent = np.r_[0, np.full(n - 1, seq + 1)].astype(np.uint64)
    return batch_from_columns(
        {
            **cols,
            "trace_id": trace_ids_to_binary([(step + 1).to_bytes(16, "big")] * n),
            "span_id": ids_to_binary(span_ids),
            "parent_span_id": ids_to_binary(parent, zero_is_null=True),
            "service": "rack-test",
            "host": "test",
        },
        n,
    )


def write_rack(directory: Path, steps: int = 10, parts: int = 2) -> Path:
    """Write `steps` steps of the synthetic rack into `directory` as `parts` parts."""
    writer = PartWriter(directory, manifest={"run_id": "rack", "topology": TOPOLOGY})
    per = max(1, steps // parts)
    seq = 0
    for first in range(0, steps, per):
        batches = []
        for step in range(first, min(steps, first + per)):
            b = step_batch(step, seq)
            seq += b.num_rows
            batches.append(b)
        writer.write(pa.Table.from_batches(batches))
    writer.write_manifest()
    return directory


def sql_utilization(directory: Path, since: int, until: int) -> dict[str, float]:
    """Per-chip busy fraction of [since, until) by the store's `utilization()` SQL macro:
    what the dashboard must show for that window."""
    con = chiptrace.connect(directory)
    rows = con.sql(
        f"SELECT chip_id, sum(busy_ns) / {until - since} AS u FROM "
        f"utilization({(until - since) / 1e6}, since_ns := {since}, until_ns := {until}) GROUP BY chip_id"
    ).fetchall()
    return dict(rows)
