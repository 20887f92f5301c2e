"""A transfer's hops are one node of the step graph (stepgraph.py, hops.py), grouped by
DuckDB out of core or in Python from rows alike; a switch's `forward` span is the record
of the transfers through it, not work that holds them; nvl72 steps (~1.8M hops) replay.
The oracle is the emulator re-run without the fault (same seed)."""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest

from chiptrace.analysis import TraceAnalysis
from chiptrace.analysis import stepgraph as sg
from chiptrace.analysis.graphs import iter_graphs
from chiptrace.analysis.steps import load_steps
from chiptrace.analysis.whatif import Change, evaluate, replay

pytest.importorskip("chiptrace.emulator")


def _emulate(out: Path, topology: str, workload: str, fault: str | None, seed: int) -> Path:
    from chiptrace.emulator import emulate

    faults = [fault] if fault else []
    emulate(
        topology=topology,
        workload=workload,
        steps=2,
        seed=seed,
        out=out,
        faults=faults,
        progress=False,
    )
    return out


def _train_p50(path: Path) -> float:
    ta = TraceAnalysis(path)
    (w,) = [w for w in ta.tables.workloads if w.name != "request"]
    s, e = w.steps.column("start_ns").to_pylist(), w.steps.column("end_ns").to_pylist()
    return float(statistics.median(b - a for a, b in zip(s, e, strict=True)))


def _fix_saving(path: Path, link: str) -> float:
    ta = TraceAnalysis(path)
    (w,) = [w for w in ta.tables.workloads if w.name != "request"]
    topo = ta.tables.topology
    fix = Change(bandwidth={link: float(topo.bandwidth(link) or 0.0)})
    return evaluate(ta.con, w.steps, topo, {"fix": fix})["fix"]["saving_ns"]


@pytest.fixture(scope="module")
def mixed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("hops")
    link = "nvlink6:gpu:2-switch:0"
    return {
        "healthy": _emulate(tmp / "healthy", "rack6", "mixed", None, 5854),
        "degrade": _emulate(tmp / "degrade", "rack6", "mixed", f"degrade:{link}:0.07", 5854),
    }


def test_hops_grouped_in_duckdb_make_the_graph_rows_make(mixed: dict[str, Path]) -> None:
    ta = TraceAnalysis(mixed["degrade"])
    (w,) = [w for w in ta.tables.workloads if w.name != "request"]
    topo = ta.tables.topology
    stored = list(iter_graphs(ta.con, w.steps))
    rows = [sg.build(st.spans, st.root_id) for st in load_steps(ta.con, w.steps, [0, 1])]
    for a, b in zip(stored, rows, strict=True):
        assert [(n.name, n.start, n.end, n.chip) for n in a.nodes] == [
            (n.name, n.start, n.end, n.chip) for n in b.nodes
        ]
        assert a.preds == b.preds and a.after == b.after
        assert int(a.hops.count.sum()) == int(b.hops.count.sum())
        transfers = sum(1 for n in a.nodes if n.link)
        assert 0 < transfers < len(a.hops)  # hops of one transfer share a node
        assert abs(replay(a, Change(), topo) - a.duration_ns) <= 1e-4 * a.duration_ns


def test_a_degraded_link_in_a_mixed_run_is_priced_by_its_rounds(mixed: dict[str, Path]) -> None:
    """The all-reduce's rounds crossed switch:0 with `forward` spans as long as they were:
    as nodes they kept the slow rounds' time and the faster link saved nothing."""
    actual = _train_p50(mixed["degrade"]) - _train_p50(mixed["healthy"])
    assert actual > 0.1 * _train_p50(mixed["healthy"])
    saving = _fix_saving(mixed["degrade"], "nvlink6:gpu:2-switch:0")
    assert abs(saving - actual) <= 0.25 * actual, (saving, actual)


@pytest.mark.timing
def test_nvl72_steps_replay(tmp_path: Path) -> None:
    """nvl72: each step (~1.8M link hops) replays unchanged within 0.1%, and a degraded
    NVLink at its bandwidth saves what the re-run without the fault does, within 25%."""
    link = "nvlink5:gpu:20-switch:7"
    healthy = _emulate(tmp_path / "h", "nvl72", "train", None, 5)
    faulty = _emulate(tmp_path / "d", "nvl72", "train", f"degrade:{link}:0.1", 5)
    ta = TraceAnalysis(faulty)
    topo = ta.tables.topology
    graphs = list(iter_graphs(ta.con, ta.tables.steps))
    assert len(graphs) == 2
    for g in graphs:
        assert len(g.hops) > 1_000_000 and len(g.nodes) < 20_000
        assert abs(replay(g, Change(), topo) - g.duration_ns) <= 1e-3 * g.duration_ns
    actual = _train_p50(faulty) - _train_p50(healthy)
    saving = _fix_saving(faulty, link)
    assert abs(saving - actual) <= 0.25 * actual, (saving, actual)


def test_a_degraded_uplink_is_priced_in_every_step(tmp_path: Path) -> None:
    """pcie8's second step is all-reduce only, all of it behind the degraded uplink: the
    other links never showed their speed in it, so the replay reads each link's fastest
    transfer over the run (the first step's input copies)."""
    link = "pcie4:switch:1-cpu:0"
    healthy = _emulate(tmp_path / "h", "pcie8", "train", None, 314)
    faulty = _emulate(tmp_path / "d", "pcie8", "train", f"degrade:{link}:0.2", 314)
    actual = _train_p50(faulty) - _train_p50(healthy)
    assert actual > _train_p50(healthy)
    saving = _fix_saving(faulty, link)
    assert abs(saving - actual) <= 0.25 * actual, (saving, actual)
