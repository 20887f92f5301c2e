"""Steps are per rank: a step's work is joined by rank and step, never across ranks, and
rank-level rules see every rank (issue 24, item 3).

The synthetic jobs (kineto_synth) are imported as real Kineto files; each verdict is
checked against the store with SQL, not against what the analysis computes."""

from __future__ import annotations

from pathlib import Path

import pytest
from kineto_synth import Job, write

from chiptrace import connect, import_trace
from chiptrace.analysis import TraceAnalysis

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "kineto"
TWO_RANKS = [FIXTURES / f"2rank_sampled_rank-{r}.json.gz" for r in (0, 1)]


def _store(tmp_path: Path, job: Job) -> Path:
    out = tmp_path / "store"
    import_trace(write(job, tmp_path / "src"), out)
    return out


def _rank(chip: str) -> str:
    return chip.split("/", 1)[0]


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    out = tmp_path_factory.mktemp("two") / "store"
    import_trace(TWO_RANKS, out)
    return out


def test_a_steps_work_is_its_own_ranks(two_ranks):
    """Every rank's ProfilerStep#N shares one trace id; each keeps its own rank's work."""
    ta = TraceAnalysis(two_ranks)
    steps = ta.tables.steps.to_pylist()
    proc = {s["span_id"]: s["proc"] for s in steps}
    rows = ta.tables.step_chips.to_pylist()
    assert len({s["trace_id"] for s in steps}) < len(steps)  # the traces are shared
    assert rows and all(_rank(r["chip_id"]) == proc[r["step_id"]] for r in rows)
    # every rank's step has its own GPU's work, and that work is what SQL finds
    con = connect(two_ranks)
    for s in steps:
        gpu = [r for r in rows if r["step_id"] == s["span_id"] and "gpu" in r["chip_id"]]
        assert len(gpu) == 1
        ((want,),) = con.execute(
            "SELECT sum(end_ns - start_ns) FROM spans WHERE chip_id = ? AND parent_span_id = ?",
            [gpu[0]["chip_id"], s["span_id"]],
        ).fetchall()
        assert gpu[0]["op_ns"] == want


def test_the_rank_whose_host_ends_earliest_is_no_straggler(tmp_path):
    # rank 7 starts its steps last (skew) but its host ops are the shortest
    out = _store(tmp_path, Job(host_op_us=[50] * 7 + [20]))
    con = connect(out)
    ends = con.sql(
        """SELECT split_part(k.chip_id, '/', 1) AS rank,
                  median(k.end_ns - s.start_ns) AS finish
           FROM spans k JOIN spans s ON s.span_id = k.parent_span_id
           WHERE s.name LIKE 'ProfilerStep#%' AND k.chip_type = 'cpu'
           GROUP BY 1 ORDER BY finish"""
    ).fetchall()
    assert ends[0][0] == "rank7"  # the trace: its host work ends earliest in its step
    rep = TraceAnalysis(out).report().to_dict()
    culprits = {(f["rule"], f["culprit"]) for f in rep["findings"]}
    assert not [c for c in culprits if c[0] in ("straggler", "load-imbalance")], culprits
    by_rule = {f["rule"]: f for f in rep["findings"]}
    # rank-level rules cover all 8 ranks
    assert by_rule["exposed-comm"]["evidence"]["chips"] == 8
    assert len(by_rule["exposed-comm"]["evidence"]["exposed_ms_by_chip"]) == 8
    assert by_rule["host-bound"]["evidence"]["chips"] == 8
    w = rep["workloads"][0]
    assert (w["steps"], w["ranks"]) == (48, 8)


def test_collective_waiting_is_not_load(tmp_path):
    """Rank 0 arrives first at every all-reduce, so its NCCL kernel runs longest: that is
    waiting, and no rule calls it more work."""
    out = _store(tmp_path, Job())
    con = connect(out)
    ((longest,),) = con.execute(
        "SELECT arg_max(chip_id, d) FROM (SELECT chip_id, sum(duration_ns) AS d FROM spans "
        "WHERE op_kind = 'comm' GROUP BY 1)"
    ).fetchall()
    assert longest == "rank0/gpu:0"
    rep = TraceAnalysis(out).report().to_dict()
    assert not [f for f in rep["findings"] if f["rule"] in ("load-imbalance", "straggler")]


def test_a_slow_gpu_is_named_against_its_own_steps(tmp_path):
    # every rank starts together; rank 3's kernels take 1.6x as long
    job = Job(skew_us=[0] * 8, kernel_us=[100] * 3 + [160] + [100] * 4)
    out = _store(tmp_path, job)
    rep = TraceAnalysis(out).report().to_dict()
    named = {f["culprit"] for f in rep["findings"] if f["rule"] in ("straggler", "rank-straggler")}
    assert named == {"rank3/gpu:3"}


def test_a_dataloader_stall_is_data_loading_and_a_malloc_step_is_warm_up(tmp_path):
    # one rank; each step fetches its batch (8 ms) before launching; the first step
    # also allocates (40 ms)
    job = Job(ranks=1, steps=6, loader_us=8_000, first_malloc_us=40_000)
    out = _store(tmp_path, job)
    rep = TraceAnalysis(out).report().to_dict()
    rules = {f["rule"]: f for f in rep["findings"]}
    assert "launch-bound" not in rules and "step-outliers" not in rules
    dl = rules["data-loading"]
    assert dl["culprit"].startswith("enumerate(DataLoader)")
    # the GPU's idle time under the fetch, from the spans: 8 ms a steady step
    ((fetch_ms,),) = (
        connect(out)
        .execute(
            "SELECT median(duration_ns) / 1e6 FROM spans WHERE name LIKE 'enumerate(DataLoader)%'"
        )
        .fetchall()
    )
    covered = dl["evidence"]["idle_covered_ms_by"][dl["culprit"]]
    assert abs(covered - fetch_ms) < 0.1
    warm = rules["warm-up"]
    assert warm["culprit"] == "ProfilerStep#1" and warm["severity"] == "info"
    assert warm["evidence"]["one_time_ms_by_call"] == {"cudaMalloc": 40.0}
