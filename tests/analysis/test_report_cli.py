"""`chiptrace report` and `chiptrace diff`: text, --json keys, --html, bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from analysis_helpers import training_run

from chiptrace.cli import main

FINDING_KEYS = {
    "rule",
    "severity",
    "culprit",
    "evidence",
    "suggestion",
    "share",
    "step",
    "saving_ms",
    "saving_pct",
    "parts",
    "kind",
}


def test_report_text(tmp_path: Path, capsys) -> None:
    d = training_run(tmp_path / "t", slow_gpu="gpu:2")
    assert main(["report", str(d)]) == 0
    out = capsys.readouterr().out
    assert "straggler" in out and "gpu:2" in out and "Critical path" in out


def test_report_json_keys(tmp_path: Path, capsys) -> None:
    d = training_run(tmp_path / "t", overlap=False)
    assert main(["report", str(d), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert {"version", "sources", "metrics", "findings", "critical_path", "utilization"} <= set(
        data
    )
    assert all(set(f) == FINDING_KEYS for f in data["findings"])
    sev = ("high", "medium", "low", "info")
    kinds = ("fault", "bottleneck", "opportunity")
    ranks = [
        (f["severity"] == "info", kinds.index(f["kind"]), sev.index(f["severity"]))
        for f in data["findings"]
    ]
    assert ranks == sorted(ranks)
    for key in ("step_ms_p50", "step_ms_p99", "utilization", "comm_share", "mfu", "spans_dropped"):
        assert key in data["metrics"]
    cp = data["critical_path"]
    assert set(cp["by_chip_type"]) >= {"gpu"} and "nvlink5" in cp["by_link_type"]
    assert abs(sum(s["on_path_ms"] for s in cp["segments"]) - cp["duration_ms"]) < 1e-3


def test_report_html(tmp_path: Path, capsys) -> None:
    d = training_run(tmp_path / "t", dpu_us=400)
    page = tmp_path / "r.html"
    assert main(["report", str(d), "--html", str(page)]) == 0
    text = page.read_text()
    assert text.startswith("<!DOCTYPE html>") and text.count("<svg") >= 2
    assert "<polyline" in text and "starvation" in text and "dpu:0" in text
    assert "<script" not in text and "http://" not in text.replace(
        'xmlns="http://www.w3.org/2000/svg"', ""
    )


def test_diff_dirs_and_saved_json(tmp_path: Path, capsys) -> None:
    a = training_run(tmp_path / "a")
    b = training_run(tmp_path / "b", overlap=False)
    assert main(["report", str(a), "--json"]) == 0
    saved = tmp_path / "a.json"
    saved.write_text(capsys.readouterr().out)
    assert main(["diff", str(saved), str(b), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    p50 = next(r for r in d["metrics"] if r["metric"] == "step_ms_p50")
    assert p50["b"] > p50["a"] and p50["ratio"] > 1
    new = [(f["rule"], f["culprit"]) for f in d["findings"] if f["status"] == "new"]
    assert ("poor-overlap", "allreduce") in new
    assert main(["diff", str(a), str(b)]) == 0
    assert "step_ms_p50" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["report", "/nonexistent/dir"], "does not exist"),
        (["diff", "{bad}", "/nonexistent"], "bad.json"),
        (["report", "{empty}"], "no trace parts"),
    ],
)
def test_bad_input_is_one_line(tmp_path: Path, capsys, argv: list[str], needle: str) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    (tmp_path / "empty").mkdir()
    argv = [a.replace("{bad}", str(bad)).replace("{empty}", str(tmp_path / "empty")) for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("chiptrace: error:") and needle in err and "\n" not in err


def test_report_on_untagged_code_and_an_empty_window(tmp_path: Path, capsys) -> None:
    import time

    import chiptrace

    d = tmp_path / "plain"
    chiptrace.init(d, flush_interval_s=60)

    @chiptrace.trace
    def outer() -> None:
        with chiptrace.span("inner"):
            time.sleep(0.001)

    for _ in range(3):
        outer()
    chiptrace.shutdown()
    assert main(["report", str(d), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["metrics"]["steps"] == 3 and data["metrics"]["utilization"] == {}
    # no training shown (no step attribute, no device work): where the time went, not a
    # critical path of a "step"
    assert data["critical_path"] is None and data["workloads"][0]["training"] is False
    by_name = {r["name"].rsplit(".", 1)[-1]: r for r in data["time_breakdown"]}
    assert by_name["inner"]["count"] == 3 and by_name["inner"]["self_ms"] >= 3.0
    assert by_name["outer"]["self_ms"] < by_name["outer"]["total_ms"]
    later = str(time.time_ns() + 10**12)
    assert main(["report", str(d), "--since-ns", later, "--json"]) == 0
    empty = json.loads(capsys.readouterr().out)
    assert empty["metrics"]["spans"] == 0 and empty["findings"] == []


def test_steps_too_big_to_walk_are_said_so(tmp_path: Path, capsys) -> None:
    d = training_run(tmp_path / "t", slow_gpu="gpu:1")
    assert main(["report", str(d), "--max-step-spans", "10"]) == 0
    out = capsys.readouterr().out
    assert "Critical path: not computed" in out and "straggler" in out  # SQL rules still run
    assert main(["report", str(d), "--max-step-spans", "10", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["critical_path"] is None and data["metrics"]["steps_sampled"] == 0
