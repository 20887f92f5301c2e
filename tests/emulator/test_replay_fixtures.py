"""Calibrate and replay on the real Kineto fixtures (issue 23): every trace whose GPUs a
preset describes replays its steps on its own machine, is not slower on a rack faster in
every part it uses, and one that names another GPU is refused in one line saying what to
pass."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_replay import FIXTURES, _replay, importers

from chiptrace.emulator import WorkloadError, calibrate, load_topology
from chiptrace.query import connect

CORPUS = FIXTURES.parent / "corpus" / "kineto"
RANKS = ("2rank_sampled_rank-0.json.gz", "2rank_sampled_rank-1.json.gz")


def _kineto_jobs() -> list[list[Path]]:
    """Every Kineto fixture (tests/fixtures/kineto and the corpus's), each file a job of
    its own but the two ranks of one job together."""
    files = sorted([*FIXTURES.glob("*.json.gz"), *CORPUS.glob("*.json.gz")])
    return [[FIXTURES / f for f in RANKS]] + [[f] for f in files if f.name not in RANKS]


def _real_ms(src: Path) -> tuple[float, int]:
    """The median profiler step and how many there are, or the whole trace where it has
    no profiler steps (the step calibrate replays then)."""
    con = connect(src)
    ((real, n),) = con.sql(
        "SELECT median(d) / 1e6, count(*) FROM (SELECT max(end_ns) - min(start_ns) AS d "
        "FROM spans WHERE parent_span_id IS NULL AND name LIKE 'ProfilerStep#%' "
        "GROUP BY trace_id)"
    ).fetchall()
    if real is None:
        ((real,),) = con.sql("SELECT (max(end_ns) - min(start_ns)) / 1e6 FROM spans").fetchall()
    return float(real), max(int(n), 1)


def _gpu_names(src: Path) -> set[str]:
    names: set[str] = set()
    for (r,) in connect(src).sql("SELECT DISTINCT resource FROM spans").fetchall():
        names.update(json.loads(r or "{}").get("device.names") or [])
    return names


def _replay_all(jobs: list[list[Path]], tmp_path: Path) -> tuple[dict, dict[str, str]]:
    """Each job replayed on its own machine and on rack6, every source step twice (the
    second pass starts over from the first): {name: (real, own, rack6 median ms)},
    and {name: the one-line error} of those calibrate refused. A trace that names no
    preset's GPU must be refused saying what to pass; the 2-rank sample (a 128-rank A100
    job whose file names no GPU) and the others are then replayed with source=a100x8."""
    chiptrace_importers = importers("chiptrace.importers")
    replayed, told = {}, {}
    for files in jobs:
        src = tmp_path / files[0].name.split(".")[0]
        chiptrace_importers.import_trace(files, src)
        placed = calibrate.machine_of(_gpu_names(src)) is not None
        source = "" if placed else "a100x8"
        real, n = _real_ms(src)
        steps = 2 * n  # every step twice: the second pass starts over from the first
        try:
            _, own = _replay(src, tmp_path / f"{src.name}-own", "a100x8", steps=steps)
        except WorkloadError as e:
            told[src.name] = str(e)
            assert "\n" not in str(e), str(e)
            if "no GPU or NPU work" in str(e):
                continue
            assert not placed and "--set source=" in str(e), str(e)
            # given what it asks for, it replays (as if on A100s: on its own machine then)
            _, own = _replay(src, tmp_path / f"{src.name}-own", "a100x8", steps, source=source)
        _, fast = _replay(src, tmp_path / f"{src.name}-rack6", "rack6", steps, source=source)
        replayed[src.name] = (real, own, fast)
    print("\nfixture real_ms own_ms rack6_ms")
    for name, (real, own, fast) in replayed.items():
        print(f"{name} {real:.2f} {own:.2f} {fast:.2f} ({own / real - 1:+.1%} on its own)")
    for name, why in told.items():
        print(f"{name}: {why.split(': ', 1)[1]}")
    for name, (real, own, fast) in replayed.items():
        # issue 23 asks for 15%; every fixture is within 2% today, so 5% catches a slip
        assert own == pytest.approx(real, rel=0.05), name
        if name != "2rank_sampled_rank-0":  # 128 ranks: cross-host, half the NICs per GPU
            assert fast <= min(real, own) * 1.001, name
    return replayed, told


def test_the_kineto_fixtures_replay_their_steps(tmp_path):
    """tests/fixtures/kineto's single files: its A100 traces within 15% on a100x8 and not slower on
    rack6 (faster GPUs and fabric, collectives within one host); the others refused in
    one line saying what to pass."""
    jobs = [j for j in _kineto_jobs() if j[0].parent == FIXTURES and len(j) == 1]
    replayed, told = _replay_all(jobs, tmp_path)  # the 2-rank job: the round-trip test
    assert set(replayed) >= {"nccl_data", "cuda_event_sync", "simple_add"}
    assert "AMD Radeon" in told["amd_mi250_minitoy_train"]
    assert "no GPU or NPU work" in told["cpu_only_rank-34"]


@pytest.mark.timing  # ~40 s here: the corpus's 1 MB ResNet traces take seconds each to import
def test_every_kineto_fixture_from_a_preset_machine_replays_its_step(tmp_path):
    """Every Kineto fixture, the corpus's too: each whose GPUs a preset describes (A100:
    a100x8, H100: h100x8) replays on its own machine within 15% of its real step (the
    whole trace where it has no profiler steps) and on rack6 not slower; each that names
    no such GPU (V100, GP100, MI250, MTIA, none) is refused in one line saying what to
    pass; one without device work says so."""
    replayed, told = _replay_all(_kineto_jobs(), tmp_path)
    placed = {"hta_alexnet", "hta_et_simple_add", "hta_event_sync_multi_stream"}
    assert set(replayed) >= placed | {"hta_triton_example", "nccl_data", "simple_add"}
    assert "V100" in told["tb_resnet50_nw0_pt19"] and "no GPU model" in told["tb_resnet50_nw0_pt18"]
    assert "ARTEMIS" in told["mtia_inference_rank_0"] and "GP100" in told["hta_gpu_user_annotation"]
    assert "no GPU or NPU work" in told["hta_cupti_profiler"]


def _faster(name: str, k: float):
    """Preset `name` with every chip's peaks and memory bandwidth and every link k times."""
    from dataclasses import replace

    topo = load_topology(name)
    chips = {
        c: replace(
            s,
            peak_flops={p: v * k for p, v in s.peak_flops.items()},
            memory_bandwidth=s.memory_bandwidth * k,
        )
        for c, s in topo.chips.items()
    }
    links = [replace(lk, bandwidth=lk.bandwidth * k) for lk in topo.links]
    return replace(topo, chips=chips, links=links, name=f"{name}-x{k:g}")


@pytest.mark.parametrize(
    ("files", "source"),
    [
        (["nccl_data.json.gz"], ""),
        (["2rank_sampled_rank-0.json.gz", "2rank_sampled_rank-1.json.gz"], "a100x8"),
    ],
)
def test_a_rack_faster_in_every_chip_and_link_never_slows_a_step(tmp_path, files, source):
    # The 128-rank job's collectives cross hosts: on rack6 (two NICs for eight GPUs, half
    # a100x8's network per GPU) they are slower; on a100x8 with everything twice as fast,
    # host time as measured, the step can only shrink.
    src = tmp_path / "imported"
    importers("chiptrace.importers").import_trace([FIXTURES / f for f in files], src)
    _, own = _replay(src, tmp_path / "own", "a100x8", steps=4, source=source)
    _, fast = _replay(src, tmp_path / "fast", _faster("a100x8", 2), steps=4, source=source)
    assert fast < own


def test_the_128_rank_job_is_slower_on_rack6_only_for_its_network(tmp_path):
    """rack6 is not faster everywhere: two 400 GbE NICs for eight GPUs are half a DGX
    A100's network per GPU, and the 128-rank job's all-to-alls cross hosts, so it replays
    slower there. Give rack6 a100x8's network per GPU (twice its Ethernet) and, faster in
    every part the job uses, it is not slower."""
    from dataclasses import replace

    src = tmp_path / "imported"
    importers("chiptrace.importers").import_trace([FIXTURES / f for f in RANKS], src)
    rack6 = load_topology("rack6")
    wide = [
        replace(lk, bandwidth=2 * lk.bandwidth) if lk.type == "ethernet" else lk
        for lk in rack6.links
    ]
    _, own = _replay(src, tmp_path / "own", "a100x8", steps=4, source="a100x8")
    _, thin = _replay(src, tmp_path / "rack6", rack6, steps=4, source="a100x8")
    _, fast = _replay(src, tmp_path / "wide", replace(rack6, links=wide), steps=4, source="a100x8")
    assert thin > 1.1 * own  # its cross-host collectives at half the bandwidth
    assert fast <= own
