"""export -> split -> import gives the run's spans exactly: the `chiptrace.context` copies that
later pieces of a split Jaeger export repeat are stored only where their span is not imported."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import chiptrace
from chiptrace.cli import main
from chiptrace.emulator import emulate

IDS = "SELECT trace_id, span_id, parent_span_id FROM spans"


@pytest.fixture(scope="module")
def pieces(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[Path]]:
    """An emulated run and its Jaeger JSON export cut into pieces of 0.5 MB."""
    root = tmp_path_factory.mktemp("split")
    run = emulate(steps=2, seed=4, out=root / "run", progress=False).out
    out = root / "j.json"
    args = ["export", str(run), "-f", "jaeger-json", "-o", str(out), "--split-mb", "0.5"]
    assert main(args) == 0
    files = sorted(root.glob("j-*.json"))
    assert len(files) >= 3
    return run, files


def _context_copies(files: list[Path]) -> int:
    return sum(
        any(t["key"] == "chiptrace.context" for t in sp["tags"])
        for f in files
        for tr in json.loads(f.read_text())["data"]
        for sp in tr["spans"]
    )


@pytest.mark.parametrize("order", ["forward", "reversed"])
def test_all_pieces_import_to_the_original_spans(pieces, tmp_path, order):
    run, files = pieces
    assert _context_copies(files) > 0  # the export did repeat ancestors
    if order == "reversed":  # the copies come before the spans they copy
        files = files[::-1]
    back = tmp_path / "back"
    summary = chiptrace.import_trace(files, back)
    original = sorted(chiptrace.connect(run).execute(IDS).fetchall())
    stored = sorted(chiptrace.connect(back).execute(IDS).fetchall())
    assert summary.spans == len(original) and stored == original
    assert sum(f["categories"]["span"] for f in summary.files) == len(original)
    dropped = sum(f["skipped"].get("context copy of an imported span", 0) for f in summary.files)
    assert dropped > 0


def test_a_piece_alone_keeps_its_ancestors_once(pieces, tmp_path):
    _, files = pieces
    last = files[-1]
    back = tmp_path / "one"
    summary = chiptrace.import_trace([last], back)
    con = chiptrace.connect(back)
    copies, distinct, total = con.execute(
        "SELECT count(*) FILTER (WHERE json_extract(attributes, '$.\"chiptrace.context\"')), "
        "count(DISTINCT (trace_id, span_id)), count(*) FROM spans"
    ).fetchone()
    assert copies > 0 and distinct == total == summary.files[0]["categories"]["span"]
    orphans = con.execute(
        "SELECT count(*) FROM spans s WHERE parent_span_id IS NOT NULL AND NOT EXISTS "
        "(SELECT 1 FROM spans p WHERE p.trace_id = s.trace_id AND p.span_id = s.parent_span_id)"
    ).fetchone()[0]
    assert orphans == 0  # one tree per trace, as in the UI
