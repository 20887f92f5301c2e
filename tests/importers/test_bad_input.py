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
    files = {
        "unknown.json": (b"hello, world", "not JSON"),
        "notrace.json": (b'{"name": "a config", "values": [1, 2, 3]}', "no trace in it"),
        "shape.json": (b'{"traceEvents": [{"ph": "X", "ts": "soon"}]}', "ts='soon'"),
        "notnumber.json": (
            b'{"traceEvents": [{"ph": "X", "name": "a", "ts": 1, "dur": 2},'
            b' {"ph": "X", "name": "step 2", "ts": "2", "dur": [3]}]}',
            "event 'step 2' (ph='X'): dur=[3]: expected a number of microseconds",
        ),
        "garbage.json": (b'{"traceEvents": [{"ph": "X", "ts": 1, nonsense', "malformed"),
        "empty.json": (b"", "empty file"),
    }
    for name, (data, _) in files.items():
        (tmp_path / name).write_bytes(data)
    return files


@pytest.mark.parametrize(
    "name",
    [
        "unknown.json",
        "notrace.json",
        "shape.json",
        "notnumber.json",
        "garbage.json",
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


def _events_file(path, cut_at=None, tail=b""):
    raw = gzip.open(KINETO / "simple_add.json.gz").read()
    data = raw[:cut_at] + tail if cut_at else raw
    path.write_bytes(gzip.compress(data) if path.name.endswith(".gz") else data)
    return raw


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("half.json", "cut short: the last"),
        ("gzip_cut.json.gz", "cut short: the gzip stream ends early"),
    ],
)
def test_cut_short_file_loads_what_is_complete_with_a_warning(tmp_path, name, why):
    """A job killed while writing its trace: the complete events load, and the summary, the
    manifest and stderr say the file was cut short (as catapult's importer loads it)."""
    import json

    f = tmp_path / name
    raw = _events_file(tmp_path / "whole.json")
    whole = _cli(str(tmp_path / "whole.json"), "--out", str(tmp_path / "w"), "--json")
    total = json.loads(whole.stdout)["spans"]
    if name.endswith(".gz"):
        gz = gzip.compress(raw)
        f.write_bytes(gz[: len(gz) * 2 // 3])
    else:
        f.write_bytes(raw[: len(raw) // 2])
    r = _cli(str(f), "--out", str(tmp_path / "o"), "--json")
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout)
    assert 0 < summary["spans"] < total
    assert any(why in w for w in summary["files"][0]["warnings"])
    assert f"warning: {f}: {why}" in r.stderr
    manifest = json.loads(next((tmp_path / "o" / "manifest").glob("*.json")).read_text())
    assert manifest["import_summary"]["files"][0]["warnings"] == summary["files"][0]["warnings"]


@pytest.mark.parametrize("tail", [b"]", b",", b",\n\n  ", b""])
def test_unclosed_or_trailing_comma_array_loads_every_event(tmp_path, tail):
    """A bare array streamed by a writer that never closed it (the Trace Event format allows a
    missing `]`), or that ends in a comma: every event loads."""
    import json

    events = [
        {"ph": "X", "name": f"op{i}", "pid": 1, "tid": 1, "ts": i * 10, "dur": 5} for i in range(4)
    ]
    body = ",\n".join(json.dumps(e) for e in events).encode()
    f = tmp_path / "t.json"
    f.write_bytes(b"[\n" + body + tail)
    r = _cli(str(f), "--out", str(tmp_path / "o"), "--json")
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout)
    assert summary["spans"] == 4
    warned = summary["files"][0].get("warnings", [])
    assert bool(warned) == tail.startswith(b","), warned


def test_numeric_string_times_are_numbers(tmp_path):
    import json

    doc = [
        {"ph": "X", "name": "a", "pid": 1, "tid": 1, "ts": "1000.5", "dur": "20"},
        {"ph": "B", "name": "b", "pid": 1, "tid": 1, "ts": "1005"},
        {"ph": "E", "name": "b", "pid": 1, "tid": 1, "ts": 1010},
    ]
    f = tmp_path / "s.json"
    f.write_text(json.dumps(doc))
    r = _cli(str(f), "--out", str(tmp_path / "o"))
    assert r.returncode == 0, r.stderr
    import chiptrace

    rows = (
        chiptrace.connect(tmp_path / "o")
        .execute("SELECT name, duration_ns FROM spans ORDER BY name")
        .fetchall()
    )
    assert rows == [("a", 20_000), ("b", 5_000)]


@pytest.mark.parametrize("name", ["bom.json", "bom.json.gz"])
def test_a_utf8_byte_order_mark_is_skipped(tmp_path, name):
    data = b'\xef\xbb\xbf[{"ph": "X", "name": "a", "pid": 1, "tid": 1, "ts": 1, "dur": 2}]'
    f = tmp_path / name
    f.write_bytes(gzip.compress(data) if name.endswith(".gz") else data)
    r = _cli(str(f), "--out", str(tmp_path / "o"))
    assert r.returncode == 0 and "chrome, 1 spans" in r.stdout, r.stderr
