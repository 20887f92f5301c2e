"""A task import checks what the in-process one does: files of different jobs are refused
without --merge, and a split Jaeger export's context copies are stored once."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

import chiptrace
from chiptrace.cli import main
from chiptrace.emulator import emulate
from chiptrace.importers import import_trace
from chiptrace.importers.source import TraceFormatError
from tests.cluster.conftest import chiptrace_cmd

pytest.importorskip("distributed", reason="Dask distributed: pip install -e '.[test,dask]'")

IDS = "SELECT trace_id, span_id, parent_span_id FROM spans"


@pytest.fixture(scope="module")
def pieces(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[Path]]:
    """An emulated run and its Jaeger JSON export cut into pieces (tests/importers'
    test_jaeger_split makes the same)."""
    root = tmp_path_factory.mktemp("split")
    run = emulate(steps=2, seed=4, out=root / "run", progress=False).out
    out = root / "j.json"
    assert main(["export", str(run), "-f", "jaeger-json", "-o", str(out), "--split-mb", "0.5"]) == 0
    files = sorted(root.glob("j-*.json"))
    assert len(files) >= 3
    return run, files


def _ids(path: Path) -> list[tuple]:
    return sorted(chiptrace.connect(path).execute(IDS).fetchall())


def test_split_jaeger_pieces_as_tasks_store_each_span_once(pieces, tmp_path):
    """In process, as tasks (`--partition-by` runs the task plan here): the pieces in
    reversed order (copies before their spans) give the exported run's spans."""
    run, files = pieces
    summary = import_trace(files[::-1], tmp_path / "back", partition_by="rank")
    assert _ids(tmp_path / "back") == _ids(run) and summary.spans == len(_ids(run))
    dropped = sum(f["skipped"].get("context copy of an imported span", 0) for f in summary.files)
    assert dropped > 0


@pytest.mark.dask
def test_cluster_import_dedupes_context_copies_and_checks_jobs(
    cluster, pieces, rank_files, tmp_path
):
    run, files = pieces
    out = tmp_path / "jaeger"
    r = chiptrace_cmd("import", *map(str, files), "--out", str(out), "--dask", cluster.address)
    assert r.returncode == 0, r.stderr
    assert _ids(out) == _ids(run)

    # The same rank twice: another job, refused in one line naming both files, as in process.
    two = sorted(rank_files.iterdir())[:2]
    again = tmp_path / f"again-{two[0].name}"
    shutil.copy(two[0], again)
    args = [*map(str, two), str(again)]
    with pytest.raises(TraceFormatError) as single:
        import_trace(args, tmp_path / "single")
    r = chiptrace_cmd("import", *args, "--out", str(tmp_path / "a"), "--dask", cluster.address)
    assert r.returncode == 2 and r.stderr.strip().splitlines()[-1].endswith(str(single.value))
    assert "both rank" in str(single.value) and not (tmp_path / "a" / "spans").exists()
    r = chiptrace_cmd(
        "import", *args, "--out", str(tmp_path / "m"), "--merge", "--dask", cluster.address
    )
    assert r.returncode == 0, r.stderr
