"""Decorated code (only spans, no topology): a thread pool where one worker is slow."""

from __future__ import annotations

import concurrent.futures as cf
import time
from pathlib import Path

import pytest

import chiptrace
from chiptrace.analysis import TraceAnalysis


def _pool_run(steps: int = 4, slow: int = 2) -> None:
    @chiptrace.trace(op="compute")
    def work(worker: int) -> None:
        with chiptrace.span("chunk", chip=f"cpu:{worker}"):
            time.sleep(0.03 if worker == slow else 0.002)

    @chiptrace.trace(name="step")
    def step(pool: cf.ThreadPoolExecutor) -> None:
        for f in [pool.submit(chiptrace.carry(work), w) for w in range(4)]:
            f.result()

    with cf.ThreadPoolExecutor(4) as pool:
        for _ in range(steps):
            step(pool)


@pytest.mark.timing  # the straggler is made of sleeps: 30 ms against 2 ms
def test_slow_worker_is_the_straggler(trace_dir: Path) -> None:
    _pool_run()
    chiptrace.flush()
    # Spans named `step` with no step attribute are tasks until --step names them steps
    # (issue 24: training advice only where the trace shows training).
    ta = TraceAnalysis(trace_dir, step_name="step")
    findings = ta.findings()
    top = findings[0]
    assert (top.rule, top.culprit) == ("straggler", "cpu:2"), [
        (f.rule, f.culprit) for f in findings
    ]
    assert top.severity == "high"
    m = ta.metrics()
    assert m["steps"] == 4 and m["mfu"] is None and m["utilization"]["cpu"] > 0
    # the slow worker's chunk sets the step's time (gaps are thread hand-offs)
    assert ta.critical_path().share("name").get("chunk", 0) > 0.2
    on_path = [s.chip_id for s in ta.critical_path().segments if s.chip_id]
    assert on_path[-1] == "cpu:2"
