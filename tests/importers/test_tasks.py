"""The import plan as tasks (chiptrace.importers.tasks) stores what run_import stores.

Same files, same seed: every column of every span equal, ids included, whether the tasks
run here or on a cluster (tests/cluster runs them on Dask). And its retry rule: a task run
twice leaves one copy of its parts.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq

from chiptrace.importers.detect import detect
from chiptrace.importers.run import run_import
from chiptrace.importers.tasks import InProcess, read_file, run_tasks, task_dir, write_file
from chiptrace.store import part_files, read_manifests
from tests.importers.conftest import JAEGER, KINETO

FILES = [KINETO / "2rank_sampled_rank-0.json.gz", KINETO / "2rank_sampled_rank-1.json.gz"]
SEED = bytes(range(16))


def _table(out) -> pa.Table:
    """Every span, dictionary columns decoded (each part has its own dictionaries)."""
    t = pa.concat_tables([pq.read_table(p) for p in part_files(out)])
    cols = [c.cast(c.type.value_type) if pa.types.is_dictionary(c.type) else c for c in t.columns]
    t = pa.table(cols, names=t.column_names)
    return t.sort_by([("start_ns", "ascending"), ("span_id", "ascending")])


def test_tasks_store_what_run_import_stores(tmp_path):
    formats = [detect(f) for f in FILES]
    run_import(FILES, formats, tmp_path / "a", "auto", SEED, None, 0)
    # `auto`: the read tasks detect the formats (a cluster's client reads no file)
    s = run_tasks(FILES, ["auto", "auto"], tmp_path / "b", "auto", SEED, InProcess())
    a, b = _table(tmp_path / "a"), _table(tmp_path / "b")
    (manifest,) = read_manifests([tmp_path / "b"])
    assert manifest["import"]["formats"] == ["kineto", "kineto"] == formats
    assert a.num_rows == b.num_rows == s.spans > 9000
    for name in a.column_names:
        assert a.column(name).equals(b.column(name)), name
    assert [p.parent.name for p in part_files(tmp_path / "b")] == ["spans", "spans"]


def test_partition_by_rank_puts_each_file_under_its_rank(tmp_path):
    formats = [detect(f) for f in FILES]
    run_tasks(FILES, formats, tmp_path / "b", "auto", SEED, InProcess(), partition_by="rank")
    parts = part_files(tmp_path / "b")
    assert sorted(p.parent.name for p in parts) == ["rank=0", "rank=1"]
    for p in parts:
        rank = p.parent.name.removeprefix("rank=")
        chips = set(pq.read_table(p, columns=["chip_id"]).column("chip_id").to_pylist())
        assert all(c.startswith(f"rank{rank}/") for c in chips if c)


def test_a_task_run_twice_replaces_its_own_output(tmp_path):
    staging = tmp_path / "staging"
    staging.mkdir()
    r1 = read_file(str(FILES[0]), "kineto", 0, str(staging), "w")
    r2 = read_file(str(FILES[0]), "kineto", 0, str(staging), "w")  # the retry
    assert r1.facts.spans == r2.facts.spans
    args = (str(staging), 0, r2.facts, 0, "", SEED, "auto", "w", None)
    n1, n2 = write_file(*args), write_file(*args)
    assert n1 == n2 == r1.facts.spans
    written = list((task_dir(staging, "write", 0) / "spans").rglob("*.parquet"))
    assert sum(pq.read_metadata(p).num_rows for p in written) == n1
    assert [p.name for p in staging.iterdir() if ".tmp-" in p.name] == []


def test_a_task_import_maps_blocks_in_the_process_pool_as_run_import_does(tmp_path):
    """`--partition-by rank --workers 2` (the task plan, in process): the file's blocks go
    to the same process pool, and the spans are the plain import's (its cut-inside-a-string
    case included)."""
    from tests.importers.test_workers import _import, _spans, _trace

    trace = tmp_path / "trace.json"
    _trace(trace, True)
    here = _import(trace, tmp_path / "here", 0)
    r = subprocess.run(
        [sys.executable, "-m", "chiptrace", "import", str(trace), "--out", str(tmp_path / "t")]
        + ["--workers", "2", "--partition-by", "rank", "--json"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads(r.stdout)["workers"] == 2
    assert _spans(tmp_path / "here") == _spans(tmp_path / "t") and here["spans"] > 0


def test_a_jaeger_file_beside_kineto_ones_is_one_task(tmp_path):
    from chiptrace.importers import import_trace

    jaeger = sorted(JAEGER.glob("*.json"))[0]
    files = [jaeger, *FILES]
    plain = import_trace(files, tmp_path / "a")
    done: list = []
    s = run_tasks(files, ["auto"] * 3, tmp_path / "b", "auto", SEED, InProcess(), done.append)
    assert [f["format"] for f in s.files] == [f["format"] for f in plain.files]
    assert s.files[0]["format"] == "jaeger-json" and s.spans == plain.spans
    assert _table(tmp_path / "b").num_rows == plain.spans
    # a read task per file (the Jaeger one only detects it), a write task per Kineto file,
    # and one task reading every Jaeger file (their context copies need them all)
    assert (done[-1].tasks_done, done[-1].tasks, done[-1].files_done) == (6, 6, 3)
