"""Stores are never mixed by accident, and errors show the way (issue 24, items 8 and 9):
`import` refuses a non-empty --out without --append and files of different jobs without
--merge; an import that stores nothing fails and says why; `report`/`query`/`view` given a
trace file point to `chiptrace import`, given a folder of runs point to its glob, and given
several runs report each (or the one --run names)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from chiptrace.cli import main


def _kineto(path: Path, rank: int, world: int, t0_us: int = 1_700_000_000_000_000) -> Path:
    """A small PyTorch profiler trace of one rank: two steps of a kernel and its launch."""
    events = []
    for step in range(2):
        ts = t0_us + step * 1000
        events += [
            {"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{step}", "pid": 1,
             "tid": 1, "ts": ts, "dur": 900},
            {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1,
             "ts": ts + 10, "dur": 5, "args": {"correlation": step + 1}},
            {"ph": "X", "cat": "kernel", "name": "gemm", "pid": 0, "tid": 7, "ts": ts + 20,
             "dur": 500, "args": {"correlation": step + 1, "device": 0, "stream": 7}},
        ]  # fmt: skip
    doc = {
        "schemaVersion": 1,
        "distributedInfo": {"rank": rank, "world_size": world, "backend": "nccl"},
        "traceEvents": events,
    }
    path.write_text(json.dumps(doc))
    return path


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def _one_line_error(err: str) -> str:
    lines = [ln for ln in err.strip().splitlines() if not ln.startswith("warning:")]
    assert len(lines) == 1 and lines[0].startswith("chiptrace: error: "), err
    return lines[0]


def test_import_into_a_non_empty_out_needs_append(tmp_path, capsys):
    out = tmp_path / "run"
    f = _kineto(tmp_path / "r0.json", 0, 1)
    assert _run(capsys, "import", str(f), "--out", str(out))[0] == 0
    before = sorted(p.name for p in out.rglob("*"))
    code, _, err = _run(capsys, "import", str(f), "--out", str(out))
    assert code == 2 and "--append" in _one_line_error(err)
    assert sorted(p.name for p in out.rglob("*")) == before
    code, stdout, _ = _run(capsys, "import", str(f), "--out", str(out), "--append")
    assert code == 0 and "stored 6 spans" in stdout
    # Two runs in one dir: queried as one (and said so), reported one by one.
    code, stdout, err = _run(capsys, "query", str(out), "SELECT count(*) AS n FROM spans")
    assert code == 0 and stdout.split()[2] == "12" and "2 runs queried as one" in err
    code, stdout, _ = _run(capsys, "report", str(out))
    assert code == 0 and stdout.count("== run ") == 2 and stdout.count("spans 6 ") == 2


@pytest.mark.parametrize(
    ("files", "why"),
    [
        ([(0, 2, 0), (0, 2, 0)], "both rank 0"),
        ([(0, 2, 0), (1, 4, 0)], "world sizes 2 and 4"),
        ([(0, 2, 0), (1, 2, 3 * 3600 * 10**6)], "clocks 3.0 hours apart"),
    ],
)
def test_files_of_different_jobs_are_refused_unless_merge(tmp_path, capsys, files, why):
    paths = [
        str(_kineto(tmp_path / f"f{i}.json", rank, world, 1_700_000_000_000_000 + shift))
        for i, (rank, world, shift) in enumerate(files)
    ]
    out = tmp_path / "out"
    code, stdout, err = _run(capsys, "import", *paths, "--out", str(out))
    line = _one_line_error(err)
    assert code == 2 and why in line and "--merge" in line and "f0.json" in line
    assert not out.exists() and "next:" not in stdout
    code, stdout, _ = _run(capsys, "import", *paths, "--out", str(out), "--merge")
    assert code == 0 and "stored 12 spans" in stdout


def test_ranks_of_one_job_import_together(tmp_path, capsys):
    paths = [str(_kineto(tmp_path / f"r{r}.json", r, 2, 1_700_000_000_000_000 + r)) for r in (0, 1)]
    code, stdout, _ = _run(capsys, "import", *paths, "--out", str(tmp_path / "o"))
    assert code == 0 and "stored 12 spans" in stdout


def test_an_import_that_stores_nothing_fails_and_says_why(tmp_path, capsys):
    f = tmp_path / "instants.json"
    f.write_text(json.dumps([{"ph": "i", "name": "mark", "pid": 1, "tid": 1, "ts": 5}] * 3))
    out = tmp_path / "out"
    code, stdout, err = _run(capsys, "import", str(f), "--out", str(out))
    line = _one_line_error(err)
    assert code == 1 and "0 spans" in line and "3 ph=i" in line and str(f) in line
    assert "next:" not in stdout and not out.exists()


@pytest.fixture
def two_runs(tmp_path, capsys):
    """A folder holding two runs, as chiptrace-traces/ after the demo and the quickstart."""
    root = tmp_path / "traces"
    for name, rank in (("first", 0), ("second", 1)):
        f = _kineto(tmp_path / f"{name}.json", rank, 1)
        assert main(["import", str(f), "--out", str(root / name)]) == 0
    capsys.readouterr()
    return root


@pytest.mark.parametrize("command", ["report", "query", "view"])
def test_a_trace_file_points_to_import(tmp_path, capsys, command):
    f = _kineto(tmp_path / "trace.json", 0, 1)
    extra = ["SELECT 1"] if command == "query" else ["--no-ui"] if command == "view" else []
    code, _, err = _run(capsys, command, str(f), *extra)
    line = _one_line_error(err)
    assert code == 2 and f"chiptrace import {f} --out DIR" in line and command in line


@pytest.mark.parametrize("command", ["report", "query", "view"])
def test_a_folder_of_runs_points_to_its_glob(two_runs, capsys, command):
    extra = ["SELECT 1"] if command == "query" else ["--no-ui"] if command == "view" else []
    code, _, err = _run(capsys, command, str(two_runs), *extra)
    line = _one_line_error(err)
    assert code == 2 and "holds 2 runs (first, second)" in line
    if command == "view":  # one dir at a time: the way is one run, or --run
        assert "--run second" in line
    else:
        assert f"'{two_runs}/*'" in line


def test_report_of_several_runs_reports_each_or_the_one_named(two_runs, capsys):
    glob = str(two_runs / "*")
    code, out, _ = _run(capsys, "report", glob)
    assert code == 0
    heads = [ln for ln in out.splitlines() if ln.startswith("== run ")]
    assert len(heads) == 2 and "first" in heads[0] and "second" in heads[1]
    assert out.count("spans 6 ") == 2  # each run on its own, never 12 as one
    code, out, _ = _run(capsys, "report", glob, "--run", "second", "--json")
    assert code == 0 and json.loads(out)["metrics"]["spans"] == 6
    code, _, err = _run(capsys, "report", glob, "--json")
    assert code == 2 and "2 runs given" in _one_line_error(err)
    code, _, err = _run(capsys, "report", glob, "--run", "nope")
    assert code == 2 and "no run matches" in _one_line_error(err)


def test_query_of_several_runs_says_so_and_takes_run(two_runs, capsys):
    glob = str(two_runs / "*")
    code, out, err = _run(capsys, "query", glob, "SELECT count(*) AS n FROM spans")
    assert code == 0 and out.split()[2] == "12" and "2 runs queried as one" in err
    code, out, err = _run(
        capsys, "query", glob, "SELECT count(*) AS n FROM spans", "--run", "first"
    )
    assert code == 0 and out.split()[2] == "6" and err == ""


def test_view_takes_run(two_runs, capsys):
    code, out, _ = _run(capsys, "view", str(two_runs), "--run", "first", "--no-ui")
    assert code == 0 and "6 spans" in out
    code, _, err = _run(capsys, "view", str(two_runs / "*"), "--no-ui")
    assert code == 2 and "2 runs" in _one_line_error(err) and "--run ID" in err
    code, out, _ = _run(capsys, "view", str(two_runs / "*"), "--run", "second", "--no-ui")
    assert code == 0 and "6 spans" in out
    code, out, _ = _run(capsys, "view", str(two_runs / "f*"), "--no-ui")
    assert code == 0 and "6 spans" in out


def test_query_errors_keep_duckdbs_hints_and_empty_sql_is_one_line(two_runs, capsys):
    run = str(two_runs / "first")
    code, _, err = _run(capsys, "query", run, "SELECT * FROM spanz")
    assert code == 2 and 'Did you mean "spans"' in _one_line_error(err)
    code, _, err = _run(capsys, "query", run, "SELECT nme FROM spans")
    assert code == 2 and 'Candidate bindings: "name"' in _one_line_error(err)
    code, out, err = _run(capsys, "query", run, "")
    assert code == 2 and "empty SQL" in _one_line_error(err) and out == ""
    code, out, _ = _run(capsys, "query", run, "SET threads = 1")
    assert code == 0 and "not shown" not in out


def test_diff_points_to_import_and_to_one_run(tmp_path, two_runs, capsys):
    f = _kineto(tmp_path / "trace.json", 0, 1)
    first = str(two_runs / "first")
    code, _, err = _run(capsys, "diff", str(f), first)
    assert code == 2 and f"chiptrace import {f} --out DIR" in _one_line_error(err)
    code, _, err = _run(capsys, "diff", str(two_runs), first)
    line = _one_line_error(err)
    assert code == 2 and "give one: chiptrace diff" in line and "--run" not in line
