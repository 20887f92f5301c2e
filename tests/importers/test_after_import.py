"""After import everything works on it: query, report, view, export, diff."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.importers.conftest import KINETO_FILES


def _run(*args: str) -> str:
    r = subprocess.run([sys.executable, "-m", "chiptrace", *args], capture_output=True, text=True)
    assert r.returncode == 0, (args, r.stderr[-2000:])
    assert "Traceback" not in r.stderr
    return r.stdout


@pytest.mark.parametrize("name", KINETO_FILES)
def test_every_command_runs_on_an_imported_trace(name, imported, tmp_path):
    out, summary = imported(name)
    assert "spans" in _run("query", str(out), "SELECT count(*) AS spans FROM spans")
    report = json.loads(_run("report", str(out), "--json"))
    assert isinstance(report["metrics"]["ranks"], list)
    _run("view", str(out), "--no-ui")
    _run("export", str(out), "--format", "chrome", "-o", str(tmp_path / "t.json"))
    _run("diff", str(out), str(out))
