"""Every public trace in tests/fixtures/corpus/expected.toml imports as written down there, and
the report on it is right or silent.

The manifest (and corpus/README.md) say where each file comes from and how its expected figures
were checked. A trace whose report is still wrong carries `report_xfail`: its report-level test
is a strict xfail, so the analysis fix that makes it pass has to delete that line.
"""

from __future__ import annotations

import math
import tomllib
from pathlib import Path
from typing import Any

import pytest

import chiptrace
from chiptrace.cli import main
from chiptrace.errors import ChiptraceError
from tests.importers.conftest import FIXTURES

MANIFEST = tomllib.loads((FIXTURES / "corpus" / "expected.toml").read_text())["trace"]
CASES = {Path(c["file"]).name.split(".json")[0]: c for c in MANIFEST}
IMPORTED = {k: c for k, c in CASES.items() if "refused" not in c and c["spans"] > 0}
# Device work: what must sit on a gpu/npu chip in a PyTorch profiler trace.
DEVICE_KINDS = "('compute', 'comm', 'memcpy', 'memset', 'sync')"


@pytest.fixture(scope="module")
def stored(tmp_path_factory):
    """Import each trace once per module: name -> (trace dir, summary)."""
    cache: dict[str, tuple[Path, Any]] = {}

    def get(name: str) -> tuple[Path, Any]:
        if name not in cache:
            out = tmp_path_factory.mktemp(name[:40])
            cache[name] = (out, chiptrace.import_trace(FIXTURES / CASES[name]["file"], out))
        return cache[name]

    return get


def test_corpus_is_whole():
    """Every file in the corpus is in the manifest, every entry names a source and a file."""
    listed = {c["file"] for c in MANIFEST}
    on_disk = {
        str(p.relative_to(FIXTURES))
        for p in (FIXTURES / "corpus").rglob("*.json*")
        if p.name != "expected.toml"
    }
    assert on_disk <= listed
    for c in MANIFEST:
        assert (FIXTURES / c["file"]).is_file(), c["file"]
        assert c.get("source"), c["file"]
    kinds = {c.get("format") for c in MANIFEST}
    assert {"kineto", "chrome", "otlp-json", "jaeger-json"} <= kinds


@pytest.mark.parametrize("name", sorted(CASES))
def test_imports_as_expected(name, stored, capsys):
    case = CASES[name]
    if "refused" in case:
        with pytest.raises(ChiptraceError) as e:
            stored(name)
        assert "\n" not in str(e.value) and case["refused"][:40] in str(e.value)
        return
    out, summary = stored(name)
    assert summary.files[0]["format"] == case["format"]
    assert summary.spans == case["spans"]
    assert summary.files[0].get("unrecognised", {}) == case.get("unrecognised", {})
    if case.get("warning"):
        assert any(case["warning"] in w for w in summary.files[0].get("warnings", []))
    if not case["spans"]:  # nothing to store: the command fails and says why
        code = main(["import", str(FIXTURES / case["file"]), "--out", str(out / "again")])
        assert code == 1 and "0 spans" in capsys.readouterr().err
        return
    con = chiptrace.connect(out)
    chips = [r[0] for r in con.execute("SELECT DISTINCT chip_id FROM spans ORDER BY 1").fetchall()]
    assert [c for c in chips if c is not None] == case["chips"]
    if case["format"] == "kineto":
        # GPU work on GPU chips, whatever the profiler's generation called it.
        misplaced = con.execute(
            f"SELECT count(*) FROM spans WHERE op_kind IN {DEVICE_KINDS} "
            "AND coalesce(chip_type, 'cpu') NOT IN ('gpu', 'npu')"
        ).fetchone()[0]
        assert misplaced == 0
        device = con.execute(
            "SELECT count(*) FROM spans WHERE chip_type IN ('gpu', 'npu')"
        ).fetchone()[0]
        assert (device > 0) == any(c.split("/")[-1][:3] in ("gpu", "npu") for c in case["chips"])


def _report(out: Path) -> dict[str, Any]:
    from chiptrace.analysis import TraceAnalysis

    return TraceAnalysis([str(out)]).report().to_dict()


def _report_cases() -> list[Any]:
    params = []
    for name in sorted(IMPORTED):
        case = IMPORTED[name]
        marks = []
        if case.get("report_xfail"):
            marks.append(pytest.mark.xfail(strict=True, reason=case["report_xfail"]))
        params.append(pytest.param(name, marks=marks, id=name))
    return params


@pytest.mark.parametrize("name", _report_cases())
def test_report_is_right_or_silent(name, stored):
    """The report's figures agree with HTA, its top finding is the true one (or there is none
    where there is nothing to fix), and it raises no rule the evidence rules out."""
    case = IMPORTED[name]
    out, _ = stored(name)
    report = _report(out)
    for rank, idle, compute, other in case.get("hta", []):
        rows = {r["rank"]: r for r in report["metrics"].get("ranks") or []}
        assert rank in rows, f"rank {rank} missing from metrics.ranks"
        assert math.isclose(rows[rank]["gpu_idle_pct"], idle, abs_tol=0.5)
        assert math.isclose(rows[rank]["gpu_compute_pct"], compute, abs_tol=0.5)
        assert math.isclose(rows[rank]["gpu_non_compute_pct"], other, abs_tol=0.5)
    findings = report.get("findings") or []
    rules = [f.get("rule") for f in findings]
    for rule in case.get("reject", []):
        assert rule not in rules, f"{rule} raised: {case['why']}"
    serious = [f.get("rule") for f in findings if f.get("severity") in ("high", "medium")]
    if case["top"] == "no training advice":  # browsers, services: `reject` says what not
        return
    if case["top"] == "none":
        assert not serious, f"nothing to fix ({case['why']}), yet {serious}"
    else:
        assert serious and serious[0] == case["top"], f"{case['top']} expected: {case['why']}"
