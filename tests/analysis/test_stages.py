"""The report's stages (analysis/stages.py) give the same report however they are mapped.

A runner that takes store paths (as a Dask worker does) and runs here: every stage opens
its own DuckDB over its share of the Parquet (one rank's folder of a --partition-by rank
store), and the report is the in-process one, key for key.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from chiptrace.analysis import TraceAnalysis
from chiptrace.analysis.stages import rank_shares
from chiptrace.importers import import_trace

ROOT = Path(__file__).resolve().parents[2]
KINETO = ROOT / "tests" / "fixtures" / "kineto"


class PathsRunner:
    """Stages get paths, not this process's connection, as on a cluster; counts calls."""

    remote = True
    parallelism = 2  # a replay's changes split in two, as on two workers

    def __init__(self) -> None:
        self.calls: dict[str, int] = {}

    def map(self, name, fn, calls):
        self.calls[name] = self.calls.get(name, 0) + len(calls)
        return [fn(*args) for args in calls]


@pytest.fixture(scope="module")
def ranks4(tmp_path_factory) -> tuple[Path, Path]:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from rank_files import make_rank_files

    tmp = tmp_path_factory.mktemp("ranks4")
    files = make_rank_files(tmp / "in", 4)
    import_trace(files, tmp / "flat")
    import_trace(files, tmp / "hive", partition_by="rank")
    return tmp / "flat", tmp / "hive"


def _report(path: Path, runner=None) -> str:
    return json.dumps(TraceAnalysis(str(path), runner=runner).report().to_dict(), default=str)


def test_per_rank_stages_over_a_partitioned_store_give_the_same_report(ranks4):
    _, hive = ranks4
    assert len(rank_shares([str(hive)]) or []) == 4
    runner = PathsRunner()
    assert _report(hive, runner) == _report(hive)
    assert runner.calls["rank"] == 4 and runner.calls["step"] >= 2
    assert runner.calls["replay"] >= 1  # the what-if replays of the findings
    # load_tables' scans, per rank (analysis/scan_stages.py): none over the whole store
    for stage in ("extent", "scan", "steps", "step-chips"):
        assert runner.calls[stage] == 4, stage
    assert "tables" not in runner.calls


def test_a_store_not_partitioned_runs_one_rank_stage(ranks4):
    flat, _ = ranks4
    assert rank_shares([str(flat)]) is None
    runner = PathsRunner()
    assert _report(flat, runner) == _report(flat)
    assert runner.calls["ranks"] == 1 and runner.calls["tables"] == 1
    assert "scan" not in runner.calls


def test_step_names_given_are_matched_over_every_rank(ranks4):
    """--step on a partitioned store: the shares' matches add up to the store's, and a
    glob that matches nothing is the same one-line error."""
    from chiptrace.analysis.errors import StepError

    _, hive = ranks4
    runner = PathsRunner()
    got = TraceAnalysis(str(hive), runner=runner, step_name="ProfilerStep#*").tables
    want = TraceAnalysis(str(hive), step_name="ProfilerStep#*").tables
    assert got.steps.num_rows == want.steps.num_rows > 4 and runner.calls["scan"] == 4
    assert got.steps.equals(want.steps) and got.step_chips.sort_by(
        [("step_id", "ascending"), ("chip_id", "ascending")]
    ).equals(want.step_chips.sort_by([("step_id", "ascending"), ("chip_id", "ascending")]))
    messages = []
    for r in (PathsRunner(), None):
        with pytest.raises(StepError) as err:
            _ = TraceAnalysis(str(hive), runner=r, step_name="nothing*").tables
        messages.append(str(err.value))
    assert messages[0] == messages[1] and "matches no span" in messages[0]


def test_a_remote_runner_needs_the_stores_paths(ranks4):
    import chiptrace
    from chiptrace.analysis.errors import AnalysisError

    flat, _ = ranks4
    with pytest.raises(AnalysisError, match="paths"):
        TraceAnalysis(chiptrace.connect(flat), runner=PathsRunner())


def test_ranks_that_share_a_chip_are_scanned_as_one_store(ranks4, tmp_path):
    """A chip in two rank folders (here: a part of rank 0 copied under rank 1) has one busy
    union, which per-rank scans cannot merge: one stage over the whole store instead."""
    import shutil

    _, hive = ranks4
    store = tmp_path / "store"
    shutil.copytree(hive, store)
    part = sorted((store / "spans" / "rank=0").glob("*.parquet"))[0]
    shutil.copy(part, store / "spans" / "rank=1" / f"copy-{part.name}")
    runner = PathsRunner()
    assert _report(store, runner) == _report(store)
    assert runner.calls["scan"] == 4 and runner.calls["tables"] == 1


def test_a_rank_whose_chip_spans_do_not_nest_is_scanned_as_the_store_is(ranks4, tmp_path):
    """Whether chip spans nest is the store's answer: a rank without nesting (here: its
    parent ids dropped) scans again with the others' answer, and the report is the same."""
    import shutil

    import pyarrow as pa
    import pyarrow.parquet as pq

    _, hive = ranks4
    store = tmp_path / "store"
    shutil.copytree(hive, store)
    for part in (store / "spans" / "rank=1").glob("*.parquet"):
        t = pq.read_table(part)
        i = t.column_names.index("parent_span_id")
        field = t.schema.field(i)
        pq.write_table(t.set_column(i, field, pa.nulls(t.num_rows, field.type)), part)
    runner = PathsRunner()
    assert _report(store, runner) == _report(store)
    assert runner.calls["scan"] == 5 and "tables" not in runner.calls  # rank 1 twice
