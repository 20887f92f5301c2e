"""Each rule on a hand-built training trace with one injected fault: the top finding names
the culprit; the healthy run has no high-severity finding."""

from __future__ import annotations

from pathlib import Path

import pytest
from analysis_helpers import training_run

from chiptrace.analysis import RULES, TraceAnalysis, analyze, sort_findings
from chiptrace.analysis.findings import Finding

CASES = {
    "slow gpu": ({"slow_gpu": "gpu:2"}, ("straggler", "gpu:2")),
    "late rank": ({"late_gpu": "gpu:1"}, ("straggler", "gpu:1")),
    "degraded link": ({"slow_link": "nvlink5:gpu:1-gpu:2"}, ("link-bound", "nvlink5:gpu:1-gpu:2")),
    "thin dpu": ({"dpu_us": 400}, ("starvation", "dpu:0")),
    "cpu optimizer": ({"cpu_optimizer_us": 300}, ("starvation", "cpu:0")),
    "small messages": ({"message_bytes": 4096}, ("latency-bound", "allreduce on nvlink5")),
    "no overlap": ({"overlap": False}, ("poor-overlap", "allreduce")),
}


@pytest.mark.parametrize("case", list(CASES))
def test_top_finding_names_the_culprit(tmp_path: Path, case: str) -> None:
    knobs, (rule, culprit) = CASES[case]
    findings = TraceAnalysis(training_run(tmp_path / "t", **knobs)).findings()
    top = findings[0]
    assert (top.rule, top.culprit) == (rule, culprit), findings[:3]
    assert top.severity == "high"
    assert top.evidence and top.suggestion and 0 < top.share <= 1


def test_healthy_run_has_no_high_finding(tmp_path: Path) -> None:
    findings = TraceAnalysis(training_run(tmp_path / "t")).findings()
    assert [f for f in findings if f.severity == "high"] == []


def test_straggler_evidence_is_robust(tmp_path: Path) -> None:
    f = TraceAnalysis(training_run(tmp_path / "t", slow_gpu="gpu:2")).findings(["straggler"])[0]
    assert f.evidence["statistic"] == "busy per step"
    # 120 us of layers per step at 4x, plus the 5 us optimizer at normal speed
    assert f.evidence["chip_ms"] == pytest.approx(4 * 0.120 + 0.005)
    assert f.evidence["peer_median_ms"] == pytest.approx(0.120 + 0.005)
    assert f.evidence["robust_z"] >= 3.5 and f.evidence["chips_compared"] == 4


def test_precision_opportunity_on_bf16(tmp_path: Path) -> None:
    ta = TraceAnalysis(training_run(tmp_path / "t", precision="bf16"))
    f = ta.findings(["precision-opportunity"])
    assert [(x.culprit, x.evidence["precision"], x.evidence["faster_format"]) for x in f] == [
        ("gpu", "bf16", "nvfp4")
    ]
    assert f[0].severity == "low"
    ta8 = TraceAnalysis(training_run(tmp_path / "t8", precision="fp8"))
    assert ta8.findings(["precision-opportunity"]) == []


def test_load_imbalance(tmp_path: Path, builder) -> None:
    t = builder.new_trace()
    root = builder.span("step", 0, 1000, trace=t)
    for i, d in enumerate((900, 300, 300, 300)):
        builder.span("work", 0, d, trace=t, parent=root, chip=f"npu:{i}")
    f = TraceAnalysis(builder.write(tmp_path / "t")).findings(["load-imbalance"])
    assert [(x.rule, x.culprit) for x in f] == [("load-imbalance", "npu:0")]
    assert f[0].evidence["imbalance"] == pytest.approx(900 / 450 - 1)


def test_roofline_flags_the_chip_below_its_peers(tmp_path: Path) -> None:
    f = TraceAnalysis(training_run(tmp_path / "t", slow_gpu="gpu:3")).findings(["compute-bound"])
    chips = [x for x in f if x.culprit == "gpu:3"]
    assert chips and chips[0].evidence["roofline_efficiency"] == pytest.approx(
        chips[0].evidence["peer_efficiency"] / 4, rel=0.01
    )
    assert any(x.severity == "info" and x.culprit.endswith("on gpu") for x in f)


def test_dropped_spans(tmp_path: Path) -> None:
    ta = TraceAnalysis(training_run(tmp_path / "t", dropped=10))
    assert ta.metrics()["spans_dropped"] == 10
    assert [x.rule for x in ta.findings(["dropped-spans"])] == ["dropped-spans"]


def test_metrics(tmp_path: Path) -> None:
    m = TraceAnalysis(training_run(tmp_path / "t", steps=5)).metrics()
    assert m["steps"] == 5 and m["step_ms_p50"] > 0 and m["step_ms_p99"] >= m["step_ms_p50"]
    assert set(m["utilization"]) == {"gpu", "dpu"} and 0 < m["utilization"]["gpu"] <= 1
    assert 0 < m["mfu"] < 1 and 0 < m["comm_share"] < 1


def test_no_overlap_raises_comm_share(tmp_path: Path) -> None:
    a = TraceAnalysis(training_run(tmp_path / "a")).metrics()
    b = TraceAnalysis(training_run(tmp_path / "b", overlap=False)).metrics()
    assert b["step_ms_p50"] > a["step_ms_p50"]
    assert b["critical_path_comm_share"] > a["critical_path_comm_share"]


def test_analyze_on_a_live_window(tmp_path: Path) -> None:
    import chiptrace

    d = training_run(tmp_path / "t", steps=6, slow_gpu="gpu:2")
    con = chiptrace.connect(d)
    lo, hi = con.sql("SELECT min(start_ns), max(end_ns) FROM spans_raw").fetchall()[0]
    half = analyze(con, since_ns=lo + (hi - lo) // 2, until_ns=hi)
    assert half and all(isinstance(f, Finding) for f in half)
    assert (half[0].rule, half[0].culprit) == ("straggler", "gpu:2")
    assert analyze(con, rules=["dropped-spans"]) == []


def test_sort_order_and_rule_ids() -> None:
    fs = [
        Finding("a", "low", "x", {}, "", 0.9),
        Finding("b", "high", "y", {}, "", 0.1),
        Finding("c", "high", "z", {}, "", 0.5),
    ]
    assert [f.rule for f in sort_findings(fs)] == ["c", "b", "a"]
    assert {"straggler", "link-bound", "starvation", "poor-overlap", "latency-bound"} <= set(RULES)
