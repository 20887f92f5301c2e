"""Batching from the queue and static placement over equals (issue 17, item 4), and the
sharded and expert-parallel training steps that use the new collectives (item 3)."""

from __future__ import annotations

import pytest

from chiptrace.emulator import build_topology, emulate
from chiptrace.query import connect


def _q(out, sql):
    return connect(out).sql(sql).fetchall()


def _batches(out, steps: int, **options) -> tuple[float, int]:
    """(mean requests a batch, most prompt tokens in one) of an inference run."""
    r = emulate(workload="infer", steps=steps, seed=1, out=out, options=options, progress=False)
    return _q(
        r.out,
        """SELECT avg(CAST(json_extract(attributes, '$."batch.requests"') AS DOUBLE)),
                  max(CAST(json_extract(attributes, '$."batch.prompt_tokens"') AS BIGINT))
           FROM spans WHERE name = 'batch'""",
    )[0]


def test_saturated_batches_fill_the_token_budget(tmp_path):
    # Two Gaudi 3s cannot keep up with 2,000 requests/s: the queue never empties, so every
    # batch takes what fits in 16,384 prompt tokens (~32 requests of ~512), not only what
    # arrived in the 5 ms after its first request (~11).
    mean, tokens = _batches(tmp_path / "i", 60, devices="npu")
    assert mean > 28 and tokens <= 16384


def test_a_batch_that_finds_a_device_free_closes_at_its_deadline(tmp_path):
    mean, _ = _batches(tmp_path / "i", 20, rate=50, devices="gpu")
    assert mean < 2  # 50 requests/s, 5 ms wait: about one request a batch


SYMMETRIC = {
    "name": "sym",
    "chip_models": {
        "G": {
            "type": "gpu",
            "peak_tflops": {"bf16": 100, "fp32": 50},
            "memory_GB": 80,
            "memory_bandwidth_GBps": 2000,
        }
    },
    "chips": [
        {"model": "G", "count": 2},
        {"type": "dpu", "count": 2, "peak_tflops": {"fp32": 1}, "memory_GB": 16},
        {"type": "switch"},
    ],
    "links": [
        {"type": "pcie4", "a": "gpu:*", "b": "switch:0"},
        {"type": "pcie4", "a": "dpu:*", "b": "switch:0"},
    ],
}


def test_static_placement_deals_equally_near_dpus_round_robin(tmp_path):
    r = emulate(
        topology=build_topology(SYMMETRIC, "sym"),
        steps=2,
        seed=1,
        out=tmp_path / "s",
        options={"layers": 1, "hidden": 256, "seq": 128},
        progress=False,
    )
    # Both DPUs are one hop from both GPUs: each feeds one GPU (ties once all went to dpu:0).
    per_dpu = _q(r.out, "SELECT chip_id, count(*) FROM spans WHERE name = 'preprocess' GROUP BY 1")
    assert sorted(per_dpu) == [("dpu:0", 2), ("dpu:1", 2)]
    out_of = _q(r.out, "SELECT DISTINCT link_src FROM spans WHERE name = 'h2d' ORDER BY 1")
    assert out_of == [("dpu:0",), ("dpu:1",), ("switch:0",)]


@pytest.mark.parametrize(
    ("options", "names"),
    [
        ({"sharding": "fsdp"}, {"fsdp.allgather", "fsdp.reducescatter", "allgather.ring"}),
        ({"moe": True}, {"moe.dispatch", "moe.combine", "alltoall", "fwd.0.experts"}),
    ],
)
def test_fsdp_and_moe_steps_emit_their_collectives(tmp_path, options, names):
    r = emulate(steps=2, seed=1, out=tmp_path / "r", options=options, progress=False)
    con = connect(r.out)
    got = {n for (n,) in con.sql("SELECT DISTINCT name FROM spans").fetchall()}
    assert names <= got
    orphans = con.sql(
        "SELECT count(*) FROM spans s LEFT JOIN spans p ON s.parent_span_id = p.span_id "
        "WHERE s.parent_span_id IS NOT NULL AND p.span_id IS NULL"
    ).fetchall()[0][0]
    assert orphans == 0
    # A GPU's compute spans never overlap: the in-layer collectives sit between them.
    (overlaps,) = con.sql(
        """SELECT count(*) FROM (SELECT start_ns, lag(end_ns) OVER (PARTITION BY chip_id
           ORDER BY start_ns) AS prev FROM spans WHERE chip_type = 'gpu') WHERE start_ns < prev"""
    ).fetchall()[0]
    assert overlaps == 0
    if "sharding" in options:  # a shard of the weights, gradients and Adam state per GPU
        assert r.workload["memory_bytes_per_gpu"] < 0.4 * 68.7e9
