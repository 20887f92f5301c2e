"""Export files are streamed and all-or-nothing: no half-written file on failure."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from chiptrace.cli import main
from chiptrace.errors import ChiptraceError
from chiptrace.exporters.textfile import write_text


def test_a_failed_write_leaves_neither_the_file_nor_a_temporary(tmp_path: Path) -> None:
    target = tmp_path / "out.json"
    target.write_text("the previous export")

    def fail_halfway(fh) -> None:  # noqa: ANN001
        fh.write('{"data":[' + "x" * 100_000)
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError):
        write_text(target, fail_halfway)
    assert target.read_text() == "the previous export"  # untouched, not half-replaced
    assert [p.name for p in tmp_path.iterdir()] == ["out.json"]


def test_an_unwritable_place_is_a_one_line_error(tmp_path: Path) -> None:
    with pytest.raises(ChiptraceError, match="cannot write .*missing"):
        write_text(tmp_path / "missing" / "out.json", lambda fh: fh.write("{}"))


@pytest.mark.parametrize("fmt", ["chrome", "jaeger-json"])
def test_dash_writes_the_document_to_stdout(
    code_trace: Path, fmt: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["export", str(code_trace), "--format", fmt, "-o", "-"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert ("traceEvents" in doc) if fmt == "chrome" else (doc["total"] == len(doc["data"]) > 0)
