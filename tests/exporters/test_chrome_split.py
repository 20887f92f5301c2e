"""A Chrome export past --split-mb becomes windows of time, each file loadable alone by the
rules Perfetto's JSON importer applies: strict JSON, a `traceEvents` array, names for every
process and thread it uses, strictly nested slices per thread, and flows whose two ends it
holds. Together the files hold every span once."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from chiptrace.cli import main
from chiptrace.emulator import emulate
from tests.exporters.test_chrome import assert_strict_nesting


def _strict(path: Path) -> dict[str, Any]:
    def refuse(name: str) -> None:
        raise ValueError(f"{path.name}: {name} is not JSON")

    doc = json.loads(path.read_text(), parse_constant=refuse)
    assert isinstance(doc, dict) and isinstance(doc["traceEvents"], list)
    return doc


def assert_loads_alone(doc: dict[str, Any]) -> None:
    """Every (pid, tid) a slice or flow uses is named in this file, and every flow start
    has its end here."""
    events = doc["traceEvents"]
    procs = {e["pid"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    threads = {
        (e["pid"], e["tid"]) for e in events if e["ph"] == "M" and e["name"] == "thread_name"
    }
    for e in events:
        if e["ph"] in ("X", "i", "s", "f"):
            assert e["pid"] in procs and (e["pid"], e["tid"]) in threads, e
    flows = Counter((e["id"], e["ph"]) for e in events if e["ph"] in ("s", "f"))
    ids = {i for i, _ in flows}
    assert all(flows[(i, "s")] == 1 == flows[(i, "f")] for i in ids)
    assert_strict_nesting(doc)


@pytest.fixture(scope="module")
def emulated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return emulate(steps=3, seed=4, out=tmp_path_factory.mktemp("emu") / "t", progress=False).out


def test_split_chrome_export_is_windows_of_time_each_loadable(
    emulated: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    whole = tmp_path / "whole.json"
    assert main(["export", str(emulated), "-f", "chrome", "-o", str(whole)]) == 0
    one = _strict(whole)
    assert_loads_alone(one)
    spans = one["otherData"]["spans"]
    size = whole.stat().st_size
    capsys.readouterr()

    out = tmp_path / "c.json"
    limit_mb = size / 4 / 1e6
    assert (
        main(["export", str(emulated), "-f", "chrome", "-o", str(out), "--split-mb", f"{limit_mb}"])
        == 0
    )
    captured = capsys.readouterr()
    files = sorted(tmp_path.glob("c-*.json"))
    assert len(files) >= 4 and not out.exists()
    assert f"{spans:,} spans" in captured.out and "window of time" in captured.err
    ids: list[str] = []
    windows = []
    for f in files:
        assert f.stat().st_size <= limit_mb * 1e6 * 1.25  # slices to 90%, then its flows
        doc = _strict(f)
        assert_loads_alone(doc)
        assert doc["otherData"]["t0_unix_ns"] == one["otherData"]["t0_unix_ns"]
        xs = [e for e in doc["traceEvents"] if e["ph"] == "X"]
        assert len(xs) == doc["otherData"]["spans"] > 0
        ids += [e["args"]["span_id"] for e in xs]
        windows.append((min(e["ts"] for e in xs), max(e["ts"] for e in xs)))
    assert len(ids) == len(set(ids)) == spans
    assert all(a[1] <= b[0] for a, b in zip(windows, windows[1:], strict=False))

    back = tmp_path / "back"
    assert main(["import", *map(str, files), "--out", str(back), "--align", "none"]) == 0
    assert main(["query", str(back), "SELECT count(*) AS n FROM spans"]) == 0
    assert str(spans) in capsys.readouterr().out


def test_split_mb_zero_is_one_file(emulated: Path, tmp_path: Path) -> None:
    out = tmp_path / "c.json"
    assert main(["export", str(emulated), "-f", "chrome", "-o", str(out), "--split-mb", "0"]) == 0
    assert out.exists() and not list(tmp_path.glob("c-*.json"))


def test_an_empty_selection_is_a_valid_document(emulated: Path, tmp_path: Path) -> None:
    out = tmp_path / "c.json"
    assert main(["export", str(emulated), "-f", "chrome", "-o", str(out), "--where", "false"]) == 0
    assert _strict(out)["traceEvents"] == []
