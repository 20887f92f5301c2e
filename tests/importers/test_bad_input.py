"""Bad files: one line naming the file and what was expected, exit 2, nothing in --out."""

from __future__ import annotations

import gzip
import subprocess
import sys

import pytest

from tests.importers.conftest import KINETO


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "chiptrace", "import", *args], capture_output=True, text=True
    )


def _bad_files(tmp_path):
    raw = gzip.open(KINETO / "simple_add.json.gz").read()
    gz = gzip.compress(raw)
    files = {
        "truncated.json.gz": (gz[: len(gz) // 2], "truncated gzip"),
        "truncated.json": (raw[: len(raw) // 2], "truncated"),
        "unknown.json": (b"hello, world", "not JSON"),
        "notrace.json": (b'{"name": "a config", "values": [1, 2, 3]}', "no trace in it"),
        "shape.json": (b'{"traceEvents": [{"ph": "X", "ts": "soon"}]}', "wrong shape"),
        "empty.json": (b"", "empty file"),
    }
    for name, (data, _) in files.items():
        (tmp_path / name).write_bytes(data)
    return files


@pytest.mark.parametrize(
    "name",
    [
        "truncated.json.gz",
        "truncated.json",
        "unknown.json",
        "notrace.json",
        "shape.json",
        "empty.json",
    ],
)
def test_bad_file_is_one_line_exit_2_and_nothing_written(tmp_path, name):
    files = _bad_files(tmp_path)
    out = tmp_path / "out"
    good = KINETO / "cuda_event_sync.json.gz"  # a good file first: its spans must not land
    r = _cli(str(good), str(tmp_path / name), "--out", str(out))
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and name in lines[0] and "expected" in lines[0], lines
    assert files[name][1] in lines[0]
    leftovers = [p for p in out.rglob("*") if p.is_file()] if out.exists() else []
    assert leftovers == []
    assert "Traceback" not in r.stderr


def test_unmapped_events_are_counted_in_summary_and_manifest(tmp_path):
    import json

    doc = {
        "traceEvents": [
            {"ph": "X", "cat": "cpu_op", "name": "a", "pid": 1, "tid": 1, "ts": 1.0, "dur": 2.0},
            {"ph": "X", "cat": "cpu_op", "name": "no dur", "pid": 1, "tid": 1, "ts": 1.0},
            {"ph": "C", "name": "mem", "pid": 1, "ts": 1.0, "args": {"v": 1}},
        ],
        "schemaVersion": 1,
    }
    f = tmp_path / "t.json"
    f.write_text(json.dumps(doc))
    r = _cli(str(f), "--out", str(tmp_path / "o"), "--json")
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout)
    assert summary["spans"] == 1 and summary["skipped"] == 2
    manifest = json.loads(next((tmp_path / "o" / "manifest").glob("*.json")).read_text())
    assert manifest["spans_skipped"] == 2 and manifest["source"] == "import"
    assert manifest["import_summary"]["files"][0]["skipped"] == {"X without dur": 1, "ph=C": 1}
