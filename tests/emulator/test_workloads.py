"""What-if checks from issue 3, and the fault signatures the analysis is proven on."""

from __future__ import annotations

import json

import pytest

from chiptrace.emulator import SCENARIOS, WorkloadError, emulate
from chiptrace.query import connect
from chiptrace.store import read_manifests


def _q(out, sql):
    return connect(out).sql(sql).fetchall()


def _phase_ms(out, phase):
    return _q(out, f"SELECT avg(duration_ns) / 1e6 FROM spans WHERE name = '{phase}'")[0][0]


def _comm_share(out):
    (row,) = _q(
        out,
        """
        SELECT sum(p.duration_ns) FILTER (WHERE p.name = 'allreduce') / sum(r.duration_ns) FILTER (WHERE p.name = 'input')
        FROM spans p JOIN spans r ON p.parent_span_id = r.span_id WHERE r.parent_span_id IS NULL""",
    )
    return row[0]


def test_nvlink_cuts_the_communication_share_against_pcie(tmp_path):
    opts = {"overlap": "false"}
    pcie = emulate(
        topology="pcie8", steps=2, seed=1, out=tmp_path / "p", options=opts, progress=False
    )
    nvl = emulate(
        topology="rack6", steps=2, seed=1, out=tmp_path / "n", options=opts, progress=False
    )
    assert _comm_share(nvl.out) < _comm_share(pcie.out) / 3


def test_nvfp4_cuts_compute_time_and_memory_against_fp16(tmp_path):
    runs = {
        p: emulate(steps=2, seed=1, out=tmp_path / p, precision=p, progress=False)
        for p in ("fp16", "nvfp4")
    }
    compute = {
        p: _q(
            r.out, "SELECT sum(duration_ns) FROM spans WHERE name LIKE 'fwd.%' OR name LIKE 'bwd.%'"
        )[0][0]
        for p, r in runs.items()
    }
    assert compute["nvfp4"] < compute["fp16"] / 2
    mem = {p: r.workload["memory_bytes_per_gpu"] for p, r in runs.items()}
    assert mem["nvfp4"] < mem["fp16"]
    assert _q(
        runs["nvfp4"].out, "SELECT DISTINCT op_precision FROM spans WHERE name = 'fwd.0'"
    ) == [("nvfp4",)]


def test_precision_falls_back_where_a_chip_lacks_it(tmp_path):
    r = emulate(
        topology="pcie8", steps=1, seed=1, out=tmp_path / "p", precision="fp8", progress=False
    )
    assert _q(r.out, "SELECT DISTINCT op_precision FROM spans WHERE name = 'fwd.0'") == [("bf16",)]


def test_dynamic_scheduling_beats_static_utilization(tmp_path):
    util = {}
    for policy in ("static", "dynamic"):
        r = emulate(
            workload="infer",
            steps=60,
            seed=3,
            out=tmp_path / policy,
            schedule=policy,
            progress=False,
        )
        (row,) = _q(
            r.out,
            """
            WITH busy AS (SELECT chip_id, sum(duration_ns) AS ns FROM spans
                          WHERE op_kind = 'compute' AND chip_type IN ('gpu', 'npu') GROUP BY chip_id),
                 extent AS (SELECT max(end_ns) - min(start_ns) AS ns FROM spans)
            SELECT avg(busy.ns / extent.ns), count(*) FROM busy, extent""",
        )
        util[policy] = row[0]
        assert row[1] == 10  # all 8 GPUs and 2 NPUs served
    assert util["dynamic"] > util["static"] + 0.1


def test_inference_spans_requests_batches_and_precisions(tmp_path):
    r = emulate(workload="infer", steps=10, seed=1, out=tmp_path / "i", progress=False)
    con = connect(r.out)
    names = dict(
        con.sql(
            "SELECT name, count(*) FROM spans WHERE parent_span_id IS NULL GROUP BY ALL"
        ).fetchall()
    )
    assert names["batch"] == 10 and names["request"] >= 10
    prec = dict(
        con.sql(
            "SELECT name, any_value(op_precision) FROM spans WHERE name IN ('prefill', 'decode') "
            "AND chip_type = 'gpu' GROUP BY ALL"
        ).fetchall()
    )
    assert prec == {"prefill": "fp8", "decode": "nvfp4"}
    tokens = con.sql(
        "SELECT count(*) FROM spans WHERE name = 'request' AND links IS NULL"
    ).fetchall()[0][0]
    assert tokens == 0  # every request links to the batch that served it


def test_inference_does_not_fit(tmp_path):
    with pytest.raises(WorkloadError, match="does not fit"):
        emulate(
            workload="infer",
            steps=1,
            out=tmp_path / "x",
            options={"layers": "2000"},
            progress=False,
        )


# ----------------------------------------------------------------- fault signatures


def _chip_busy(out, name_like):
    return dict(
        _q(
            out,
            f"SELECT chip_id, sum(duration_ns) FROM spans WHERE name LIKE '{name_like}' GROUP BY ALL",
        )
    )


def test_slow_gpu_computes_longer_and_stalls_the_others(tmp_path):
    base = emulate(steps=2, seed=1, out=tmp_path / "b", progress=False)
    slow = emulate(steps=2, seed=1, out=tmp_path / "s", faults=["slow:gpu:3:4"], progress=False)
    busy = _chip_busy(slow.out, "fwd.%")
    assert busy["gpu:3"] == pytest.approx(4 * busy["gpu:0"], rel=0.05)
    assert _phase_ms(slow.out, "train_step") > 1.5 * _phase_ms(base.out, "train_step")


def test_degraded_nvlink_slows_its_transfers(tmp_path):
    link = "nvlink6:gpu:1-switch:0"
    r = emulate(steps=1, seed=1, out=tmp_path / "d", faults=[f"degrade:{link}:0.1"], progress=False)
    rate = dict(
        _q(
            r.out,
            "SELECT link_id, sum(op_bytes) / sum(duration_ns) FROM spans "
            "WHERE name = 'allreduce.ring' GROUP BY ALL",
        )
    )
    assert rate[link] < 0.2 * rate["nvlink6:gpu:5-switch:0"]


@pytest.mark.parametrize(
    ("kwargs", "phase", "factor"),
    [
        ({"faults": ["slow:dpu:0:8"]}, "input", 3.0),  # thin DPU
        ({"options": {"preprocess_flops_per_byte": "800"}}, "input", 3.0),  # under-provisioned DPUs
        ({"options": {"optimizer": "cpu"}}, "optimizer", 5.0),  # CPU-bound optimizer
    ],
)
def test_bottleneck_knobs_show_in_their_phase(tmp_path, kwargs, phase, factor):
    base = emulate(steps=2, seed=1, out=tmp_path / "b", progress=False)
    hit = emulate(steps=2, seed=1, out=tmp_path / "h", progress=False, **kwargs)
    assert _phase_ms(hit.out, phase) > factor * _phase_ms(base.out, phase)


def _exposed_comm_ms(out):
    (row,) = _q(
        out,
        "SELECT max(end_ns) FILTER (WHERE name = 'allreduce') - "
        "max(end_ns) FILTER (WHERE name = 'backward') FROM spans",
    )
    return row[0] / 1e6


def test_small_buckets_make_the_allreduce_latency_bound(tmp_path):
    # Ideal compute: backward at its roofline hides the least communication, so the
    # latency-bound signature stands out (kernel efficiencies stretch backward by ~1.6x).
    ideal = {"efficiency": "ideal"}
    base = emulate(steps=1, seed=1, out=tmp_path / "b", options=ideal, progress=False)
    small = emulate(
        steps=1, seed=1, out=tmp_path / "s", options={**ideal, "bucket_mb": "8"}, progress=False
    )
    assert small.workload["buckets"] > 100 * base.workload["buckets"]
    assert _exposed_comm_ms(small.out) > 5 * _exposed_comm_ms(base.out)
    # Each collective moves little: the links run far below their bandwidth.
    rate = _q(
        small.out,
        "SELECT sum(op_bytes) / sum(duration_ns) FROM spans WHERE name = 'allreduce.ring'",
    )[0][0]
    assert rate * 1e9 < 0.5 * 1.8e12


def test_no_overlap_serializes_allreduce_after_backward(tmp_path):
    r = emulate(steps=1, seed=1, out=tmp_path / "n", options={"overlap": "false"}, progress=False)
    (row,) = _q(
        r.out,
        "SELECT max(end_ns) FILTER (WHERE name = 'backward'), "
        "min(start_ns) FILTER (WHERE name = 'allreduce') FROM spans",
    )
    assert row[1] >= row[0]
    base = emulate(steps=1, seed=1, out=tmp_path / "o", progress=False)
    (row,) = _q(
        base.out,
        "SELECT max(end_ns) FILTER (WHERE name = 'backward'), "
        "min(start_ns) FILTER (WHERE name = 'allreduce') FROM spans",
    )
    assert row[1] < row[0]


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_every_named_scenario_runs_and_records_itself(tmp_path, name):
    r = emulate(**SCENARIOS[name], steps=1, seed=1, out=tmp_path / name, progress=False)
    (m,) = read_manifests([r.out])
    assert m["spans_written"] == r.spans > 0
    assert [f["spec"] for f in m["faults"]] == SCENARIOS[name].get("faults", [])


def test_dynamic_placement_moves_input_work_off_a_thin_dpu(tmp_path):
    phase = {}
    for policy in ("static", "dynamic"):
        r = emulate(
            steps=3,
            seed=1,
            out=tmp_path / policy,
            faults=["slow:dpu:0:8"],
            schedule=policy,
            progress=False,
        )
        phase[policy] = _phase_ms(r.out, "input")
        share = dict(
            _q(r.out, "SELECT chip_id, count(*) FROM spans WHERE name = 'preprocess' GROUP BY ALL")
        )
        if policy == "dynamic":
            assert share["dpu:1"] > share.get("dpu:0", 0)
    assert phase["dynamic"] < phase["static"]


def test_gpu_optimizer_links_to_the_last_allreduce_bucket(tmp_path):
    r = emulate(steps=1, seed=1, out=tmp_path / "o", progress=False)
    con = connect(r.out)
    rows = con.sql("SELECT links FROM spans WHERE name = 'adam'").fetchall()
    assert len(rows) == 8
    target = {json.loads(x)[0]["span_id"] for (x,) in rows}
    (only,) = target
    assert con.sql(f"SELECT name FROM spans WHERE span_id = '{only}'").fetchall() == [
        ("allreduce.bucket",)
    ]


def test_inference_spans_say_what_an_overloaded_queue_needs(tmp_path):
    """Arrivals, each request's wait and device, and the queue behind each batch (issue
    23): at twice what rack6 serves the queue grows batch after batch; at a light rate it
    stays near empty."""
    import json

    from chiptrace.emulator import emulate
    from chiptrace.query import connect

    depth = {}
    for rate in (100, 4000):
        r = emulate(
            workload="infer",
            steps=120,
            seed=3,
            out=tmp_path / str(rate),
            progress=False,
            options={"rate": rate},
        )
        con = connect(r.out)
        rows = con.sql(
            "SELECT r.attributes, q.duration_ns FROM spans r JOIN spans q "
            "ON q.parent_span_id = r.span_id AND q.name = 'queue' WHERE r.name = 'request'"
        ).fetchall()
        for attrs, queued in rows:
            a = json.loads(attrs)
            assert a["request.queue_ns"] == pytest.approx(queued, abs=1)
            assert a["request.device"].split(":")[0] in ("gpu", "npu")
        batches = con.sql(
            "SELECT attributes FROM spans WHERE name = 'batch' ORDER BY start_ns"
        ).fetchall()
        depth[rate] = [json.loads(a)["batch.queue_depth"] for (a,) in batches]
    light, heavy = depth[100], depth[4000]
    assert max(light) <= 5
    quarter = len(heavy) // 4
    first, last = heavy[:quarter], heavy[-quarter:]
    assert sum(last) / len(last) > 2 * sum(first) / len(first) > 0
