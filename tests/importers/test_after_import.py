"""After import everything works on it: query, report, view, export, diff.

The commands run in this process through the CLI's `main()` (as `chiptrace ...` would run
them, output and exit code included): five subprocesses per fixture cost ~2 minutes."""

from __future__ import annotations

import json

import pytest

from chiptrace.cli import main
from tests.importers.conftest import KINETO_FILES


def _run(capsys, *args: str) -> str:
    code = main(list(args))
    out, err = capsys.readouterr()
    assert code == 0, (args, err[-2000:])
    assert "Traceback" not in err
    return out


@pytest.mark.parametrize("name", KINETO_FILES)
def test_every_command_runs_on_an_imported_trace(name, imported, tmp_path, capsys):
    out, summary = imported(name)
    assert "spans" in _run(capsys, "query", str(out), "SELECT count(*) AS spans FROM spans")
    report = json.loads(_run(capsys, "report", str(out), "--json"))
    assert isinstance(report["metrics"]["ranks"], list)
    _run(capsys, "view", str(out), "--no-ui")
    _run(capsys, "export", str(out), "--format", "chrome", "-o", str(tmp_path / "t.json"))
    assert json.loads((tmp_path / "t.json").read_text())["traceEvents"]
    _run(capsys, "diff", str(out), str(out))
