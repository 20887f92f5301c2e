"""What a finding is (`kind`: fault, bottleneck, opportunity) and the report's order: faults
first, then bottlenecks, then opportunities, info last. Each emulated case checks the
finding against the emulator re-run without its fault (or with the bottleneck made twice
as fast), as benchmarks/bench_culprits.py does at scale."""

from __future__ import annotations

from pathlib import Path

import fault_cases as fc
import pytest

from chiptrace.analysis import Finding, TraceAnalysis, sort_findings

pytest.importorskip("chiptrace.emulator")


def test_kind_orders_before_severity_and_info_is_last() -> None:
    fs = [
        Finding("precision-opportunity", "high", "gpu", {}, "", 0.6),
        Finding("link-bound", "high", "pcie4:a", {}, "", 0.5, kind="bottleneck"),
        Finding("straggler", "low", "gpu:3", {}, "", 0.02),
        Finding("link-down", "info", "nvlink6:b", {}, "", 0.0),
        Finding("compute-bound", "medium", "gpu:1", {}, "", 0.05, kind="fault"),
    ]
    assert [f.rule for f in sort_findings(fs)] == [
        "compute-bound",
        "straggler",
        "link-bound",
        "precision-opportunity",
        "link-down",
    ]
    assert fs[0].kind == "opportunity" and fs[2].kind == "fault" and fs[1].kind == "bottleneck"
    assert Finding("warm-up", "low", "x", {}, "").to_dict()["kind"] == "bottleneck"


def _pair(case: fc.Case, root: Path) -> tuple[float, list[Finding]]:
    """The step the fault costs (re-run without it) and the faulty run's findings."""
    healthy = fc.the_step(TraceAnalysis(fc.emulate_case(case, root / "h", fault=False)), False)
    ta = TraceAnalysis(fc.emulate_case(case, root / "f"))
    return fc.the_step(ta, False) - healthy, ta.findings()


def _first_and_priced(case: fc.Case, root: Path, kind: str) -> Finding:
    actual, found = _pair(case, root)
    shown = [(f.kind, f.severity, f.rule, f.culprit, round(f.saving_ns / 1e6, 2)) for f in found]
    top = found[0]
    assert case.target in (top.culprit, *top.parts), shown
    assert top.kind == kind, shown
    assert abs(top.saving_ns - actual) <= 0.25 * actual, (actual, shown)
    return top


def test_a_degraded_nvlink_in_a_mixed_run_is_the_first_fault(tmp_path: Path) -> None:
    """The switch's `forward` spans last as long as the transfers crossing it: the replay
    must not hold a faster link's transfers to them (this one was priced 0, below the
    precision opportunity)."""
    link = "nvlink6:gpu:2-switch:0"
    case = fc.Case("rack6", "mixed", "degrade", 11, f"degrade:{link}:0.1", link)
    top = _first_and_priced(case, tmp_path, "fault")
    assert top.rule == "link-bound" and top.severity == "high"


def test_a_lone_chip_slower_than_its_model_is_a_fault(tmp_path: Path) -> None:
    """pcie8 has one DPU: no peers to compare, but the run records what its model does;
    priced at that speed, not twice as fast, and listed before the PCIe fabric."""
    case = fc.Case("pcie8", "train", "slow-host", 12, "slow:dpu:0:1.6", "dpu:0")
    top = _first_and_priced(case, tmp_path, "fault")
    assert top.rule == "critical-chip" and top.evidence["slower_than_model"] >= 1.5


def test_a_dpu_cut_off_by_its_link_is_that_link_down(tmp_path: Path) -> None:
    link = "pcie5:dpu:1-cpu:1"
    case = fc.Case("rack6", "train", "down", 13, f"down:{link}", link)
    top = _first_and_priced(case, tmp_path, "fault")
    assert top.rule == "link-down" and top.evidence["cut_off"] == "dpu:1"


def test_a_dpu_link_routing_avoids_is_priced_as_its_dpu_cut_off(tmp_path: Path) -> None:
    """Degraded far enough, the DPU's one link carries nothing: not down (link-state says
    up), avoided, and it costs what the DPU's lost share of the work costs."""
    link = "pcie5:dpu:0-cpu:0"
    case = fc.Case("rack6", "train", "degrade", 16, f"degrade:{link}:0.15", link)
    top = _first_and_priced(case, tmp_path, "fault")
    assert top.rule == "link-avoided" and top.evidence["cut_off"] == "dpu:0"


def test_the_inherent_pcie_fabric_is_confirmed_by_emulating_it_faster(tmp_path: Path) -> None:
    """A healthy pcie8 run waits for its PCIe fabric: one bottleneck with its links as
    parts, whose saving is what emulating those links at twice their bandwidth saves."""
    case = fc.Case("pcie8", "train", "healthy", 14)
    ta = TraceAnalysis(fc.emulate_case(case, tmp_path / "h"))
    found = ta.findings()
    fabric = next(f for f in found if f.rule == "link-bound")
    assert fabric.kind == "bottleneck" and len(fabric.parts) >= 8, found
    assert not [f for f in found if f.kind == "fault" and f.severity != "info"], found
    fast = TraceAnalysis(fc.emulate_case(case, tmp_path / "x2", faster_links=fabric.parts))
    emulated = fc.the_step(ta, False) - fc.the_step(fast, False)
    assert abs(fabric.saving_ns - emulated) <= 0.25 * emulated, (fabric.saving_ns, emulated)


def test_an_unused_nic_is_not_down(tmp_path: Path) -> None:
    """Inference on rack6 takes requests in through one NIC: the other is idle, not down."""
    case = fc.Case("rack6", "infer-steady", "healthy", 15)
    found = TraceAnalysis(fc.emulate_case(case, tmp_path / "h")).findings()
    assert not [f for f in found if f.rule == "link-down"], found
