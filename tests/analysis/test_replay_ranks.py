"""The ranks of a step are one graph joined at their collectives (analysis/graphs.py): a
rank made slower or later delays every rank's step in the replay, as in the trace.

Synthetic 8-rank Kineto jobs (kineto_synth: each rank's NCCL all-reduce ends when the last
rank arrives) imported as real files; the oracle is the same job without the fault."""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest
from kineto_synth import Job, write

from chiptrace import import_trace
from chiptrace.analysis import TraceAnalysis, graphs
from chiptrace.analysis.graphs import iter_graphs
from chiptrace.analysis.whatif import Change, replay_all

RANK3_GPU = "rank3/gpu:3"


@pytest.fixture(scope="module")
def jobs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("ranks")
    made = {
        "healthy": Job(skew_us=[0] * 8),
        "slow": Job(skew_us=[0] * 8, kernel_us=[100] * 3 + [160] + [100] * 4),
        "late": Job(skew_us=[0] * 3 + [3_000] + [0] * 4),
    }
    out = {}
    for name, job in made.items():
        out[name] = tmp / name
        import_trace(write(job, tmp / f"src-{name}"), out[name])
    return out


def _replay(path: Path, changes: dict[str, Change]) -> dict[str, list[float]]:
    ta = TraceAnalysis(path)
    graphs = list(iter_graphs(ta.con, ta.tables.steps))
    assert graphs and all(len(g.members) == 8 for g in graphs)  # one graph a step, 8 ranks
    return replay_all(graphs, changes, ta.tables.topology)


def _p50(v: list[float]) -> float:
    return float(statistics.median(v))


def test_a_slow_ranks_gpu_delays_every_rank(jobs: dict[str, Path]) -> None:
    healthy = _p50(_replay(jobs["healthy"], {})["measured"])
    r = _replay(
        jobs["slow"],
        {
            "none": Change(),
            "rank3": Change(speed={RANK3_GPU: 1.6}),
            "rank0": Change(speed={"rank0/gpu:0": 1.6}),
        },
    )
    for was, now in zip(r["measured"], r["none"], strict=True):
        assert abs(now - was) <= 1e-4 * was  # unchanged, every rank's step comes back
    actual = _p50(r["measured"]) - healthy
    assert actual > 0.03 * healthy
    # rank 3's GPU as fast as the others: every rank's all-reduce ends sooner
    assert max(abs(new - healthy) for new in r["rank3"]) <= 0.1 * actual
    assert r["rank0"] == r["none"]  # a rank that waits at the all-reduce saves nothing


def test_a_late_rank_is_priced_by_the_replay(jobs: dict[str, Path]) -> None:
    healthy = _p50(_replay(jobs["healthy"], {})["measured"])
    r = _replay(jobs["late"], {"fix": Change(undelay=frozenset({RANK3_GPU}))})
    actual = _p50(r["measured"]) - healthy
    assert abs(_p50(r["fix"]) - healthy) <= 0.05 * actual
    found = [f for f in TraceAnalysis(jobs["late"]).findings() if f.culprit == RANK3_GPU]
    assert found and found[0].rule == "rank-straggler"
    assert found[0].evidence.get("what_if")  # replayed, not the rule's own estimate
    assert abs(found[0].saving_ns - actual) <= 0.25 * actual, (found[0].saving_ns, actual)


def test_ranks_too_big_to_join_replay_one_by_one(
    jobs: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(graphs, "JOIN_MAX_SPANS", 10)
    ta = TraceAnalysis(jobs["slow"])
    steps = ta.tables.steps
    alone = list(iter_graphs(ta.con, steps))
    assert len(alone) == steps.num_rows and not any(g.members for g in alone)
    r = replay_all(alone, {"none": Change()}, ta.tables.topology)
    assert all(abs(a - b) <= 1e-4 * a for a, b in zip(r["measured"], r["none"], strict=True))
