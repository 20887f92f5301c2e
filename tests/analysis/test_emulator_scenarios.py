"""The scenario suite on the emulator: each injected fault's culprit is the top finding;
the healthy run has no high-severity finding. Small runs (rack6, 3 steps) keep it fast."""

from __future__ import annotations

from pathlib import Path

import pytest

from chiptrace.analysis import TraceAnalysis

emulator = pytest.importorskip("chiptrace.emulator")

# (emulate keyword arguments, expected (rule, culprit) of the top finding)
SCENARIOS = {
    "slow gpu": ({"faults": ["slow:gpu:3:4"]}, ("straggler", "gpu:3")),
    "degraded nvlink": (
        {"faults": ["degrade:nvlink6:gpu:1-switch:0:0.1"]},
        ("link-bound", "nvlink6:gpu:1-switch:0"),
    ),
    "thin dpu": ({"faults": ["slow:dpu:0:8"]}, (None, "dpu:0")),
    "cpu optimizer": ({"options": {"optimizer": "cpu"}}, ("starvation", "cpu:0")),
    "straggler rank": ({"faults": ["straggler:gpu:5:5"]}, ("straggler", "gpu:5")),
    "latency-bound all-reduce": (
        {"options": {"bucket_mb": 8, "layers": 4}, "steps": 2},
        ("latency-bound", "allreduce.ring on nvlink6"),
    ),
    "no overlap": ({"options": {"overlap": False}}, ("poor-overlap", "allreduce.ring")),
}


def _run(tmp_path: Path, **kwargs) -> TraceAnalysis:
    kwargs.setdefault("steps", 3)
    out = tmp_path / "run"
    emulator.emulate(topology="rack6", seed=1, out=out, progress=False, **kwargs)
    return TraceAnalysis(out)


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_top_finding_names_the_injected_culprit(tmp_path: Path, name: str) -> None:
    kwargs, (rule, culprit) = SCENARIOS[name]
    findings = _run(tmp_path, **kwargs).findings()
    top = findings[0]
    assert top.culprit == culprit, [(f.severity, f.rule, f.culprit) for f in findings[:4]]
    if rule is not None:  # a thin DPU shows as slow-vs-peers or starvation: both name it
        assert top.rule == rule
    assert top.severity in ("high", "medium") and top.suggestion


def test_healthy_run_has_no_high_finding(tmp_path: Path) -> None:
    ta = _run(tmp_path)
    assert [f for f in ta.findings() if f.severity == "high"] == []
    m = ta.metrics()
    assert m["steps"] == 3 and 0 < m["mfu"] <= 1 and m["utilization"]["gpu"] > 0.5
    cp = ta.critical_path()
    assert cp is not None and sum(s.on_path_ns for s in cp.segments) == cp.duration_ns
    assert cp.share("chip_type").get("gpu", 0) > 0.5


def test_nvlink_beats_pcie_on_comm_share(tmp_path: Path) -> None:
    nv = _run(tmp_path / "nv", steps=2).metrics()
    out = tmp_path / "pcie"
    emulator.emulate(topology="pcie8", seed=1, steps=2, out=out, progress=False)
    pcie = TraceAnalysis(out).metrics()
    assert pcie["step_ms_p50"] > nv["step_ms_p50"]
    assert pcie["critical_path_comm_share"] > nv["critical_path_comm_share"]


def test_diff_nvlink_vs_pcie(tmp_path: Path, capsys) -> None:
    import json

    from chiptrace.cli import main

    for name, topo in (("nv", "rack6"), ("pcie", "pcie8")):
        emulator.emulate(topology=topo, seed=1, steps=2, out=tmp_path / name, progress=False)
    assert main(["diff", str(tmp_path / "nv"), str(tmp_path / "pcie"), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    rows = {r["metric"]: r for r in d["metrics"]}
    assert rows["step_ms_p50"]["ratio"] > 1
    assert any(f["status"] == "new" and f["rule"] == "link-bound" for f in d["findings"])
