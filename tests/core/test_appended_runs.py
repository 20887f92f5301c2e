"""A store that holds two emulated runs over the same time (`emulate --append`) is refused by
report and diff with one line naming the runs and how to report one; each run alone
reports MFU and shares within 100%."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from chiptrace._runs import overlapping_runs
from chiptrace.cli import main
from chiptrace.store import part_files


@pytest.fixture(scope="module")
def appended(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("ap") / "run"
    assert main(["emulate", "--steps", "2", "--out", str(out), "--no-progress"]) == 0
    assert main(["emulate", "--steps", "2", "--out", str(out), "--append", "--no-progress"]) == 0
    return out


def test_report_and_diff_refuse_overlapping_runs_in_one_line(
    appended: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    writers = overlapping_runs(part_files(appended))
    assert len(writers) == 2
    capsys.readouterr()
    for argv in (["report", str(appended)], ["diff", str(appended), str(appended)]):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "2 emulated runs over the same time" in err[0]
        assert all(w in err[0] for w in writers)


def test_each_run_alone_reports_within_100_percent(
    appended: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    capsys.readouterr()
    for writer in overlapping_runs(part_files(appended)):
        one = f"{appended}/spans/part-{writer}-*.parquet"  # the way out the error names
        assert main(["report", one, "--json"]) == 0
        report = json.loads(capsys.readouterr().out)
        assert 0 < report["metrics"]["mfu"] <= 1
        for f in report["findings"]:
            for key, value in f["evidence"].items():
                if key.endswith("share") and isinstance(value, float):
                    assert 0 <= value <= 1, (f["rule"], key, value)


def test_one_run_is_not_refused(tmp_path: Path) -> None:
    out = tmp_path / "run"
    assert main(["emulate", "--steps", "1", "--out", str(out), "--no-progress"]) == 0
    assert overlapping_runs(part_files(out)) == []
