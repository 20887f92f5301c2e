"""The mixed workload: every chip type of rack6 does modelled work, deterministically."""

from __future__ import annotations

import pytest

from chiptrace.emulator import WorkloadError, emulate
from chiptrace.query import connect
from chiptrace.schema import CHIP_TYPES


def _q(out, sql):
    return connect(out).sql(sql).fetchall()


def test_mixed_loads_all_six_chip_types(tmp_path):
    r = emulate(workload="mixed", steps=3, seed=2, out=tmp_path / "m", progress=False)
    busy = dict(
        _q(
            r.out,
            "SELECT chip_type, sum(duration_ns) FROM spans WHERE chip_id IS NOT NULL GROUP BY 1",
        )
    )
    assert set(busy) == set(CHIP_TYPES)
    assert all(ns > 0 for ns in busy.values()), busy
    kinds = dict(
        _q(
            r.out,
            "SELECT chip_type, list(DISTINCT op_kind) FROM spans WHERE chip_type IN ('nic', 'switch', 'cpu') GROUP BY 1",
        )
    )
    assert kinds["nic"] == ["io"] and kinds["switch"] == ["comm"] and kinds["cpu"] == ["compute"]
    # NPUs serve; GPUs train: no training op lands on an NPU, no inference op on a GPU.
    assert _q(
        r.out,
        "SELECT DISTINCT chip_type FROM spans WHERE name IN ('prefill', 'decode') AND chip_id IS NOT NULL",
    ) == [("npu",)]
    assert r.workload["kind"] == "mixed" and r.workload["infer"]["devices"] == ["npu:0", "npu:1"]


def test_mixed_times_come_from_the_model(tmp_path):
    r = emulate(workload="mixed", steps=2, seed=2, out=tmp_path / "m", progress=False)
    # A NIC burst moves input_mb at the 50 GB/s Ethernet uplink plus one 2.5 us hop.
    (rx,) = _q(r.out, "SELECT DISTINCT duration_ns, op_bytes FROM spans WHERE name = 'rx'")
    assert rx[1] == 64_000_000 and rx[0] == pytest.approx(64e6 / 50e9 * 1e9 + 2500, abs=2)
    # Each chip does one op at a time (a CPU loads its ranks' inputs one after another, a
    # switch forwarding two NICs' bursts at once shows one span): no op spans overlap on a chip.
    overlaps = _q(
        r.out,
        """SELECT count(*) FROM spans a JOIN spans b ON a.chip_id = b.chip_id
        AND a.span_id < b.span_id AND a.start_ns < b.end_ns AND b.start_ns < a.end_ns""",
    )
    assert overlaps == [(0,)]
    (fwd,) = _q(r.out, "SELECT count(*), sum(op_bytes) FROM spans WHERE chip_id = 'switch:1'")
    # Each NIC receives its 4 ranks' bursts back to back, both NICs at once: the Ethernet
    # switch shows 4 merged slots a step, carrying all 8 ranks' input.
    assert fwd == (2 * 4, 2 * 8 * 64_000_000)
    # A DPU preprocesses an input only once one has arrived: per DPU, its i-th preprocess
    # starts after its i-th arrival (h2dpu copy) ends.
    rows = _q(
        r.out,
        """SELECT coalesce(chip_id, link_dst), name, list(CASE WHEN name = 'preprocess'
        THEN start_ns ELSE end_ns END ORDER BY 1) FROM spans
        WHERE name IN ('preprocess', 'h2dpu') AND (link_dst LIKE 'dpu:%' OR chip_id LIKE 'dpu:%') GROUP BY ALL""",
    )
    times = {(d, n): sorted(v) for d, n, v in rows}
    for dpu in ("dpu:0", "dpu:1"):
        pre, arrived = times[(dpu, "preprocess")], times[(dpu, "h2dpu")]
        assert len(pre) == len(arrived) == 8 and all(
            p >= a for p, a in zip(pre, arrived, strict=True)
        )


def test_mixed_same_seed_same_table(tmp_path):
    sql = "SELECT * EXCLUDE (attributes) FROM spans ORDER BY span_id"
    a = emulate(workload="mixed", steps=2, seed=5, out=tmp_path / "a", progress=False)
    b = emulate(workload="mixed", steps=2, seed=5, out=tmp_path / "b", progress=False)
    c = emulate(workload="mixed", steps=2, seed=6, out=tmp_path / "c", progress=False)
    ta, tb = (connect(x.out).sql(sql).to_arrow_table() for x in (a, b))
    assert ta.num_rows > 1000 and ta.equals(tb)
    assert not ta.equals(connect(c.out).sql(sql).to_arrow_table())


def test_mixed_knobs_are_checked(tmp_path):
    with pytest.raises(WorkloadError, match="infer_devices = 'tpu'"):
        emulate(
            workload="mixed",
            steps=1,
            out=tmp_path / "x",
            options={"infer_devices": "tpu"},
            progress=False,
        )
    with pytest.raises(WorkloadError, match="host_load_flops_per_byte"):
        emulate(
            workload="mixed",
            steps=1,
            out=tmp_path / "y",
            options={"host_load_flops_per_byte": -1},
            progress=False,
        )


def test_mixed_on_a_rack_without_npus_only_trains(tmp_path):
    r = emulate(
        topology="pcie8", workload="mixed", steps=1, seed=1, out=tmp_path / "p", progress=False
    )
    assert r.workload["infer"] is None
    types = {
        t for (t,) in _q(r.out, "SELECT DISTINCT chip_type FROM spans WHERE chip_id IS NOT NULL")
    }
    assert types == {"gpu", "cpu", "dpu", "nic", "switch"}
