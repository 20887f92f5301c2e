"""The step graph and its what-if replay (chiptrace/analysis/stepgraph.py, whatif.py):
unchanged, the replay gives back each measured step; with the fault's opposite applied
(a slow GPU sped up, a degraded link at its bandwidth, a straggler's delay removed), it
gives the step the emulator measures without the fault; `chiptrace whatif` prints it."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from chiptrace.analysis import TraceAnalysis
from chiptrace.analysis.graphs import iter_graphs
from chiptrace.analysis.whatif import Change, evaluate, replay
from chiptrace.cli import main

pytest.importorskip("chiptrace.emulator")


def _run(tmp: Path, name: str, topology: str = "rack6", fault: str | None = None) -> Path:
    from chiptrace.emulator import emulate

    out = tmp / name
    faults = [fault] if fault else []
    emulate(topology=topology, steps=3, seed=7, out=out, faults=faults, progress=False)
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("whatif")
    return {
        "healthy": _run(tmp, "healthy"),
        "slow": _run(tmp, "slow", fault="slow:gpu:2:2"),
        "degrade": _run(tmp, "degrade", fault="degrade:nvlink6:gpu:6-switch:0:0.1"),
        "straggler": _run(tmp, "straggler", fault="straggler:gpu:5:6"),
        "pcie8": _run(tmp, "pcie8", topology="pcie8"),
    }


def _p50_steps(path: Path) -> float:
    t = TraceAnalysis(path).tables.steps
    ends, starts = t.column("end_ns").to_pylist(), t.column("start_ns").to_pylist()
    return statistics.median(e - s for s, e in zip(starts, ends, strict=True))


@pytest.mark.parametrize("name", ["healthy", "slow", "degrade", "straggler", "pcie8"])
def test_unchanged_replay_gives_back_every_step(runs: dict[str, Path], name: str) -> None:
    ta = TraceAnalysis(runs[name])
    graphs = list(iter_graphs(ta.con, ta.tables.steps))
    assert len(graphs) == ta.tables.steps.num_rows == 3
    for g in graphs:
        assert g.edges > len(g.nodes) // 2  # transfers, rounds and phases are joined
        assert abs(replay(g, Change(), ta.tables.topology) - g.duration_ns) <= 1e-4 * g.duration_ns


@pytest.mark.parametrize(
    ("name", "change"),
    [
        ("slow", Change(speed={"gpu:2": 2.0})),
        ("degrade", Change(bandwidth={"nvlink6:gpu:6-switch:0": 1.8e12})),
        ("straggler", Change(undelay=frozenset({"gpu:5"}))),
    ],
)
def test_undoing_the_fault_replays_the_healthy_step(
    runs: dict[str, Path], name: str, change: Change
) -> None:
    ta = TraceAnalysis(runs[name])
    r = evaluate(ta.con, ta.tables.steps, ta.tables.topology, {"fix": change})["fix"]
    actual = _p50_steps(runs[name]) - _p50_steps(runs["healthy"])
    assert actual > 0.02 * _p50_steps(runs["healthy"])
    assert abs(r["saving_ns"] - actual) <= 0.1 * actual, (r, actual)


def test_a_faster_link_behind_a_saturated_one_saves_nothing(runs: dict[str, Path]) -> None:
    """pcie8's GPUs share PCIe uplinks: one GPU's own link 2x faster changes nothing, every
    PCIe 4.0 link 10x faster shortens the step."""
    ta = TraceAnalysis(runs["pcie8"])
    t = ta.tables
    one = {lk.id: lk.bandwidth * 2 for lk in t.topology.links if lk.id == "pcie4:gpu:5-switch:1"}
    every = {lk.id: lk.bandwidth * 10 for lk in t.topology.links if lk.type == "pcie4"}
    assert one, [lk.id for lk in t.topology.links]
    r = evaluate(
        ta.con, t.steps, t.topology, {"one": Change(bandwidth=one), "all": Change(bandwidth=every)}
    )
    step = r["one"]["measured_ns"]
    assert abs(r["one"]["saving_ns"]) < 0.005 * step
    assert r["all"]["saving_ns"] > 0.05 * step


def test_whatif_cli(runs: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["whatif", str(runs["slow"]), "--speed", "gpu:2=2", "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)["workloads"]
    assert row["step"] == "train_step" and row["steps_replayed"] == 3
    assert 30 < row["saving_pct"] < 60
    assert main(["whatif", str(runs["healthy"]), "--link", "nvlink6=2x"]) == 0
    assert "train_step: 3 steps" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--speed", "gpu:33=2"], "'gpu:33'"),
        (["--link", "nvlink7=2x"], "nvlink6"),
        (["--speed", "gpu:3=fast"], "'fast'"),
        (["--undelay", "gpx"], "gpu"),
    ],
)
def test_whatif_bad_names_are_one_line(
    runs: dict[str, Path], capsys: pytest.CaptureFixture[str], args: list[str], needle: str
) -> None:
    assert main(["whatif", str(runs["healthy"]), *args]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("chiptrace: error:") and "\n" not in err and needle in err, err
