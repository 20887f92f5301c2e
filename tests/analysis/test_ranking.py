"""Findings priced by replay (chiptrace/analysis/ranking.py): one saturated PCIe fabric is
one finding with its links as `parts`; a chip the rules call slow but that does its work
as fast as its peers saves nothing (info); an overloaded serving queue is named with both
rates; a straggler no rule names is found by the replay sweep."""

from __future__ import annotations

from pathlib import Path

import pytest

from chiptrace.analysis import TraceAnalysis

pytest.importorskip("chiptrace.emulator")


def _emulate(out: Path, **kw: object) -> Path:
    from chiptrace.emulator import emulate

    return emulate(out=out, progress=False, **kw).out  # type: ignore[arg-type]


def test_a_saturated_fabric_is_one_finding_with_parts(tmp_path: Path) -> None:
    found = TraceAnalysis(_emulate(tmp_path / "p", topology="pcie8", steps=2, seed=3)).findings()
    links = [f for f in found if f.rule == "link-bound"]
    assert len(links) == 1, [(f.rule, f.culprit) for f in found]
    (f,) = links
    assert f.culprit in f.parts and len(f.parts) >= 8
    assert all(p.startswith("pcie4:") for p in f.parts)
    assert f.evidence["what_if"] == "every part fixed together" and f.share >= 0.01
    assert f.to_dict()["parts"] == list(f.parts)


def test_every_finding_under_one_percent_is_info(tmp_path: Path) -> None:
    ta = TraceAnalysis(_emulate(tmp_path / "r", steps=2, seed=4, faults=["slow:gpu:6:2"]))
    found = ta.findings()
    assert (found[0].rule, found[0].culprit) == ("straggler", "gpu:6")
    for f in found:
        if f.evidence.get("what_if"):
            assert f.share >= 0.01 or f.severity == "info", f


def test_an_overloaded_queue_names_both_rates(tmp_path: Path) -> None:
    opts = {"rate": 4000, "layers": 8, "efficiency": "ideal"}
    out = _emulate(tmp_path / "i", workload="infer", steps=80, seed=5, options=opts)
    found = TraceAnalysis(out).findings()
    (q,) = [f for f in found if f.rule == "queue-overload"]
    ev = q.evidence
    assert ev["arrival_rate_per_s"] > ev["service_rate_per_s"] > 0
    assert ev["latency_last_quarter_ms"] > 1.5 * ev["latency_first_quarter_ms"]
    # The pool shares the batcher's queue (parts: every device); the NPUs fall behind.
    assert q.culprit in q.parts and len(q.parts) == 10, q.parts
    assert q.culprit.startswith("npu:") and ev["overloaded_devices"] == ["npu:0", "npu:1"]
    assert not [f for f in found if f.rule == "step-outliers"]  # the queue is the cause


def test_the_sweep_finds_a_straggler_in_a_mixed_run(tmp_path: Path) -> None:
    out = _emulate(
        tmp_path / "m", workload="mixed", steps=2, seed=110, faults=["straggler:gpu:3:7"]
    )
    found = TraceAnalysis(out).findings()
    f = found[0]
    assert (f.rule, f.culprit, f.step) == ("straggler", "gpu:3", "train_step"), found[:3]
    assert f.evidence["found_by"] == "replay" and 2e6 < f.saving_ns < 5e6


def test_a_degraded_link_routing_avoids_is_not_called_down(tmp_path: Path) -> None:
    """Routing goes around a link at 7.5% of its bandwidth: it carried nothing, but the run
    reports it up (link_state telemetry, not the injected fault), so it is `link-avoided`, never `link-down`; a downed link stays down."""
    opts = {"rate": 400, "layers": 8, "efficiency": "ideal"}
    fault = "degrade:pcie5:nic:0-cpu:0:0.075"
    out = _emulate(
        tmp_path / "d", workload="infer", steps=80, seed=840, options=opts, faults=[fault]
    )
    found = TraceAnalysis(out).findings()
    assert not [f for f in found if f.rule == "link-down"]
    (f,) = [f for f in found if f.rule == "link-avoided"]
    assert f.culprit == "pcie5:nic:0-cpu:0" and f.evidence["recorded_bandwidth_fraction"] == 0.075
    down = _emulate(tmp_path / "n", steps=2, seed=3, faults=["down:nvlink6:gpu:4-switch:0"])
    top = TraceAnalysis(down).findings()[0]
    assert (top.rule, top.culprit) == ("link-down", "nvlink6:gpu:4-switch:0")
