"""A fixed slice of the random fault matrix (fault_cases.py; benchmarks/bench_culprits.py
runs it at scale): each fault kind once on rack6, on training, mixed and steady inference,
targets and values drawn from a fixed seed. A fault that moves the step by 2% or more is
named within the top 3 findings, with a saving within 25% of what re-running without it
saves; a downed link the traffic cannot route around is a one-line error naming it; a
healthy run has no high finding and at most 5 above info."""

from __future__ import annotations

import statistics
from pathlib import Path

import fault_cases as fc
import pytest

from chiptrace.analysis import TraceAnalysis
from chiptrace.analysis.metrics import step_durations

pytest.importorskip("chiptrace.emulator")

SLICE = fc.fixed_slice()


@pytest.mark.parametrize("cell", SLICE, ids=["-".join(c) for c in SLICE])
def test_the_fault_is_named_and_priced(cell: tuple[str, str, str], tmp_path: Path) -> None:
    o = fc.run(*cell, seed=23, root=tmp_path)
    shown = [(f.severity, f.rule, f.culprit, round(f.saving_ns / 1e6, 3)) for f in o.findings[:5]]
    if o.case.kind == "healthy":
        assert not [f for f in o.findings if f.severity == "high"], shown
        assert sum(f.severity != "info" for f in o.findings) <= 5, shown
        return
    if o.error is not None:  # only a downed link may fail the run, and it must say which
        assert o.case.kind == "down" and o.case.target in o.error and "\n" not in o.error
        return
    assert o.rank is not None or o.moved < fc.MOVES, (o.case.fault, o.moved, shown)
    if o.moved >= fc.MOVES:
        assert o.rank <= 3, (o.case.fault, shown)
        assert o.saving_ok, (o.case.fault, o.claimed, o.actual, shown)


def test_precision_saving_matches_an_nvfp4_run(tmp_path: Path) -> None:
    """bf16 work on a B200 is 4x from nvfp4 (its own pair; the fp32 optimizer, memory-bound,
    gains nothing): the estimate is what emulating the same run in nvfp4 saves."""
    from chiptrace.emulator import emulate

    base = emulate(steps=4, seed=1, out=tmp_path / "bf16", progress=False).out
    ta = TraceAnalysis(base)
    f = next(f for f in ta.findings() if f.rule == "precision-opportunity")
    assert (f.evidence["precision"], f.evidence["faster_format"]) == ("bf16", "nvfp4")
    assert f.evidence["peak_ratio"] == 4.0 and f.severity == "low"
    out = emulate(steps=4, seed=1, out=tmp_path / "fp4", precision="nvfp4", progress=False).out
    fast = statistics.median(step_durations(TraceAnalysis(out).tables))
    actual = statistics.median(step_durations(ta.tables)) - fast
    assert abs(f.saving_ns - actual) <= 0.25 * actual, (f.saving_ns, actual)
