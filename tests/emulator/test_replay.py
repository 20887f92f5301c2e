"""Calibrate and replay (issue 17, item 5): a real job's profiler steps, fitted and replayed
on its own machine (its step times come back) and on others."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from chiptrace.emulator import WorkloadError, calibrate, emulate, load_topology
from chiptrace.query import connect
from chiptrace.schema import batch_from_columns
from chiptrace.store import PartWriter

FIXTURES = Path(__file__).parent.parent / "fixtures" / "kineto"
GEMM = "void cutlass::Kernel<cutlass_80_tensorop_bf16_s16816gemm_relu_256x128_32x3_nn_align8>"
GEMM_FLOPS = 150e12 * 4e-3  # 150 TFLOP/s for 4 ms: 48% of the A100's 312
AR_BYTES = 64e6
# (name, start ms, duration ms, op kind, stream, bytes, flops, collective) per rank and step
OPS = [
    (GEMM, 0, 4, "compute", 7, 0, GEMM_FLOPS, ""),
    ("void at::native::vectorized_elementwise_kernel<4>", 5, 1, "compute", 7, 0, 0, ""),
    ("ncclKernel_AllReduce_RING_LL_Sum_bf16", 6, 9, "comm", 40, AR_BYTES, 0, "allreduce"),
]
STEP_MS = 17  # 2 ms of host time after the last kernel


def _row(trace: int, span: int, parent: int | None, name: str, a: float, b: float, **kw) -> dict:
    return {
        "trace_id": bytes([trace]) * 16,
        "span_id": span.to_bytes(8, "big"),
        "parent_span_id": None if parent is None else parent.to_bytes(8, "big"),
        "name": name,
        "start_ns": int(a * 1e6),
        "end_ns": int(b * 1e6),
        **kw,
    }


def _job(
    out: Path,
    steps: int = 3,
    ops: list = OPS,
    step_ms: float = STEP_MS,
    world: int | None = None,
    gpu: str = "NVIDIA A100-SXM4-40GB",
    members: str = "",
) -> Path:
    """A 2-rank bf16 job laid out as `chiptrace import` lays out a PyTorch profiler trace:
    ProfilerStep#N roots, kernels on rankR/gpu:R with their stream, NCCL bytes and group
    (a job of `world` ranks as the profiler's distributedInfo states it)."""
    rows, sid = [], 0
    for s in range(steps):
        t0, root = s * 20, sid + 1
        sid += 1
        rows.append(_row(s + 1, root, None, f"ProfilerStep#{s}", t0, t0 + step_ms))
        for r in range(2):
            for name, a, d, kind, stream, nb, fl, coll in ops:
                sid += 1
                attrs = {"thread.id": stream}
                if coll:
                    attrs |= {"Collective name": coll, "Group size": 2}
                    attrs |= {"Process Group Ranks": members} if members else {}
                rows.append(
                    _row(
                        s + 1,
                        sid,
                        root,
                        name,
                        t0 + a,
                        t0 + a + d,
                        chip_id=f"rank{r}/gpu:{r}",
                        chip_type="gpu",
                        op_kind=kind,
                        op_bytes=int(nb) or None,
                        op_flops=int(fl) or None,
                        attributes=json.dumps(attrs),
                    )
                )
    cols = {k: [row.get(k) for row in rows] for k in {k for row in rows for k in row}}
    cols["service"] = "pytorch"
    resource = {"device.names": [gpu]}
    cols["resource"] = json.dumps(resource | ({"distributed.world_size": world} if world else {}))
    w = PartWriter(out, manifest={"source": "test"})
    w.write(batch_from_columns(cols, len(rows)))
    w.close()
    return out


def _replay(src: Path, out: Path, topology: str, steps: int = 3, **options):
    r = emulate(
        topology=topology,
        workload="replay",
        steps=steps,
        seed=1,
        out=out,
        options={"calibrate": str(src), **options},
        progress=False,
    )
    (median,) = (
        connect(r.out)
        .sql("SELECT median(duration_ns) FROM spans WHERE parent_span_id IS NULL")
        .fetchall()[0]
    )
    return r, median / 1e6


def test_replay_on_its_own_machine_gives_its_step_times_back(tmp_path):
    src = _job(tmp_path / "job")
    r, median = _replay(src, tmp_path / "own", "a100x8")
    assert median == pytest.approx(STEP_MS, rel=0.01)
    w = r.workload
    assert w["source_topology"] == "a100x8" and w["source_precision"] == "bf16"
    # gemm fitted from the trace's FLOPs; comm from the all-reduce on A100 NVLink (a 2-rank
    # ring: 2 hops of 2.5 us, then 64 MB at 300 GB/s x eff) against the 9 ms measured
    assert w["efficiency_fitted"]["gemm"] == pytest.approx(150 / 312, rel=1e-3)
    assert w["efficiency_basis"] == {"gemm": "fitted", "comm": "fitted"}
    bandwidth_ms = AR_BYTES / 300e9 * 1e3
    assert w["efficiency_fitted"]["comm"] == pytest.approx(bandwidth_ms / (9 - 0.005), rel=1e-3)
    names = {n for (n,) in connect(r.out).sql("SELECT DISTINCT name FROM spans").fetchall()}
    assert {GEMM, "ProfilerStep#0", "allreduce.ring"} <= names


def test_replay_elsewhere_scales_each_class_by_its_rate(tmp_path):
    src = _job(tmp_path / "job")
    r, median = _replay(src, tmp_path / "h100", "h100x8")
    h100 = load_topology("h100x8").chips["gpu:0"]
    # the job's GEMMs ran at 48% of the A100's peak where the A100 preset says 80%: on
    # the H100 they keep that ratio to its preset's 65%
    fit = (150 / 312) / 0.8
    want = 4 * 312 * fit * 0.8 / (989.4 * h100.efficiency["gemm"]["bf16"] * fit)
    (gemm_ms,) = (
        connect(r.out)
        .sql(f"SELECT median(duration_ns) / 1e6 FROM spans WHERE name = '{GEMM}'")
        .fetchall()[0]
    )
    assert gemm_ms == pytest.approx(want, rel=1e-3)
    assert median < STEP_MS  # faster GEMMs, NVLink 4, the host time kept
    _, nvfp4 = _replay(src, tmp_path / "fp4", "rack6", precision="nvfp4")
    _, bf16 = _replay(src, tmp_path / "bf16", "rack6")
    assert nvfp4 < bf16


def test_calibration_errors_are_one_line(tmp_path):
    with pytest.raises(WorkloadError, match="not a trace directory"):
        _replay(tmp_path / "nothing", tmp_path / "o1", "rack6")
    plain = tmp_path / "plain"
    emulate(steps=1, out=plain, progress=False)
    # no profiler steps: the whole trace is one step, but its GPUs must be named
    with pytest.raises(WorkloadError, match=r"names no GPU model, .* --set source=PRESET \("):
        _replay(plain, tmp_path / "o2", "rack6")
    with pytest.raises(WorkloadError, match="needs calibrate = DIR"):
        emulate(workload="replay", steps=1, out=tmp_path / "o3", progress=False)


importers = pytest.importorskip  # the Kineto importer (issue 14) makes the fixtures' dirs


@pytest.mark.parametrize(
    ("files", "source"),
    [
        (["nccl_data.json.gz"], ""),  # rank 0 of a 2-rank A100 job (device names in the file)
        (["2rank_sampled_rank-0.json.gz", "2rank_sampled_rank-1.json.gz"], "a100x8"),
    ],
)
def test_calibration_round_trip_on_the_kineto_fixtures(tmp_path, files, source):
    chiptrace_importers = importers("chiptrace.importers")
    src = tmp_path / "imported"
    chiptrace_importers.import_trace([FIXTURES / f for f in files], src)
    (real,) = (
        connect(src)
        .sql(
            "SELECT median(d) FROM (SELECT max(end_ns) - min(start_ns) AS d FROM spans "
            "WHERE parent_span_id IS NULL AND name LIKE 'ProfilerStep#%' GROUP BY trace_id)"
        )
        .fetchall()[0]
    )
    r, median = _replay(src, tmp_path / "replay", "a100x8", steps=4, source=source)
    assert median == pytest.approx(real / 1e6, rel=0.15)
    assert r.workload["ranks"] == sorted(r.workload["ranks"]) and r.workload["source_steps"] >= 2


def test_a_gpu_running_behind_its_host_keeps_the_hosts_period(tmp_path):
    # The GPU finishes each step 7 ms into the next one (as a trace whose host runs ahead
    # shows): the replay keeps the 20 ms period instead of waiting for the device work.
    lagged = [(n, a + 12, d, *rest) for n, a, d, *rest in OPS]
    src = _job(tmp_path / "job", steps=4, ops=lagged, step_ms=20)
    r, median = _replay(src, tmp_path / "own", "a100x8", steps=6)
    assert median == pytest.approx(20, rel=0.01)
    gaps = (
        connect(r.out)
        .sql(
            f"SELECT start_ns - lag(end_ns) OVER (ORDER BY start_ns) FROM spans "
            f"WHERE chip_id = 'gpu:0' AND name = '{GEMM}' ORDER BY start_ns"
        )
        .fetchall()
    )
    assert [g / 1e6 for (g,) in gaps[2:]] == pytest.approx([16.0] * (len(gaps) - 2), abs=0.01)


@pytest.mark.parametrize(("world", "ratio"), [(2, 300 / 1800), (8, 300 / 1800), (16, 25 / 12.5)])
def test_collectives_without_bytes_scale_by_the_links_they_cross(tmp_path, world, ratio):
    # No bytes, no group: the job's world size says whether the collective leaves the host
    # (a100x8 and rack6 hold 8 GPUs): NVLink 3 against NVLink 6 within one, the NICs'
    # network links per GPU (HDR 25 GB/s each against two 50 GB/s for 8 GPUs) across.
    ops = [(n, a, d, k, q, 0, fl, "") for n, a, d, k, q, _, fl, _ in OPS]
    src = _job(tmp_path / "job", ops=ops, world=world)
    r, _ = _replay(src, tmp_path / "rack6", "rack6")
    assert r.workload["world_size"] == world
    (comm,) = (
        connect(r.out)
        .sql("SELECT median(duration_ns) / 1e6 FROM spans WHERE name LIKE 'ncclKernel%'")
        .fetchall()[0]
    )
    assert comm == pytest.approx(9 * ratio, rel=1e-3)


def test_network_bandwidth_per_gpu_counts_only_the_nics_network_links():
    from chiptrace.emulator.hosts import nic_bw

    figures = {p: nic_bw(load_topology(p)) / 1e9 for p in ("a100x8", "h100x8", "rack6")}
    assert figures == pytest.approx({"a100x8": 25.0, "h100x8": 50.0, "rack6": 12.5})


def test_an_h100_trace_replays_on_h100x8(tmp_path):
    src = _job(tmp_path / "job", gpu="NVIDIA H100 80GB HBM3")
    r, median = _replay(src, tmp_path / "own", "h100x8")
    assert r.workload["source_topology"] == "h100x8"
    assert median == pytest.approx(STEP_MS, rel=0.01)
    assert calibrate.machine_of(["NVIDIA A100 80GB PCIe"]) == "pcie8"


@pytest.mark.parametrize(("members", "crosses"), [("[0, 8]", True), ("[8, 9]", False)])
def test_a_group_crosses_hosts_by_its_ranks_not_its_size(tmp_path, members, crosses):
    # Two ranks of a 16-rank job: ranks 0 and 8 sit on two 8-GPU hosts, so their
    # all-reduce crosses the NICs (a100x8 25 GB/s per GPU, rack6 12.5: twice as long);
    # ranks 8 and 9 share a host and are re-planned on rack6's NVLink 6.
    src = _job(tmp_path / "job", world=16, members=members)
    r, _ = _replay(src, tmp_path / "rack6", "rack6")
    ((comm,),) = (
        connect(r.out)
        .sql("SELECT median(duration_ns) / 1e6 FROM spans WHERE name LIKE 'ncclKernel%'")
        .fetchall()
    )
    if crosses:
        assert comm == pytest.approx(9 * 25 / 12.5, rel=1e-3)
    else:
        # re-planned at the job's fitted efficiency: NVLink 3 -> 6, plus the hops' latency
        assert comm == pytest.approx(9 * 300 / 1800, rel=0.01)
        assert r.workload["efficiency_basis"]["comm"] == "fitted"
