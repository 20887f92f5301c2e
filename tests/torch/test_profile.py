"""chiptrace.torch.profile(): a real training loop's profiler ops in the trace of the
chiptrace spans around them, schedules, and what is left on disk."""

from __future__ import annotations

import shutil

import pytest

from tests.torch.conftest import ancestors, read_spans

pytestmark = pytest.mark.torch


def _by_id(rows: list[dict]) -> dict[str, dict]:
    return {r["span_id"]: r for r in rows}


def test_aten_ops_are_inside_the_step_span_around_them(trace_dir, train_step):
    import chiptrace.torch

    with chiptrace.span("train") as train:
        with chiptrace.torch.profile() as prof:
            for i in range(3):
                with chiptrace.span("step", attributes={"i": i}):
                    train_step()
    assert prof.wait(60)  # the import runs in a process of its own
    assert (prof.traces_imported, prof.traces_failed) == (1, 0)

    rows = read_spans(trace_dir)
    by_id = _by_id(rows)
    steps = [r for r in rows if r["name"] == "step"]
    aten = [r for r in rows if r["name"].startswith("aten::")]
    assert len(steps) == 3 and len(aten) > 50
    train_trace = f"{train.trace_id.hex()}"
    for op in aten:
        holder = [s for s in steps if s["start_ns"] <= op["start_ns"] < s["end_ns"]]
        assert len(holder) == 1, op["name"]  # every op of the loop ran inside a step
        chain = ancestors(op, by_id)
        assert holder[0] in chain, op["name"]  # ... and hangs under that step
        assert chain[-1]["name"] == "train"
        assert op["trace_id"] == train_trace
    # One op per kind of work each step did, each under that step: forward, backward, update.
    for s in steps:
        under = {r["name"] for r in rows if s in ancestors(r, by_id)}
        assert {"aten::linear", "aten::relu", "Optimizer.step#SGD.step"} <= under
        assert any(n.startswith("autograd::engine::evaluate_function") for n in under)
    ops = [r for r in aten if r["name"] == "aten::linear"]
    assert {r["chip_id"] for r in ops} == {"cpu:0"} and {r["service"] for r in ops} == {"test"}
    # No Kineto JSON file is left behind.
    assert not [p for p in trace_dir.rglob("*") if ".json" in p.name and "manifest" not in p.parts]


def test_schedule_records_the_active_steps_and_imports_each_cycle(trace_dir, train_step, torch):
    import chiptrace.torch

    ready = []
    schedule = torch.profiler.schedule(wait=1, warmup=1, active=2, repeat=2)
    with chiptrace.torch.profile(schedule=schedule, on_trace_ready=ready.append) as prof:
        for i in range(8):
            with chiptrace.span("step", attributes={"i": i}):
                train_step()
            prof.step()
    assert prof.wait(60)
    assert prof.traces_imported == 2 and len(ready) == 2  # the user's handler ran too

    rows = read_spans(trace_dir)
    by_id = _by_id(rows)
    marked = sorted(r["name"] for r in rows if r["name"].startswith("ProfilerStep#"))
    assert marked == ["ProfilerStep#2", "ProfilerStep#3", "ProfilerStep#6", "ProfilerStep#7"]
    recorded = set()
    for r in rows:
        if r["name"].startswith("aten::"):
            step = next(a for a in ancestors(r, by_id) if a["name"] == "step")
            recorded.add(step["attributes"])
    assert recorded == {f'{{"i":{i}}}' for i in (2, 3, 6, 7)}


def test_keep_traces_keeps_the_kineto_files(trace_dir, train_step, tmp_path):
    import chiptrace.torch

    keep = tmp_path / "kineto"
    with chiptrace.torch.profile(keep_traces=keep):
        train_step()
    chiptrace.torch.profile().wait(60)
    kept = list(keep.glob("*.json"))
    assert len(kept) == 1
    # The kept file is a Kineto trace `chiptrace import` reads on its own.
    summary = chiptrace.import_trace(kept, tmp_path / "again")
    assert summary.spans > 50


def test_a_profile_inside_a_profile_leaves_the_recording_to_the_outer(trace_dir, train_step, torch):
    import chiptrace.torch

    with chiptrace.torch.profile(
        schedule=lambda step: torch.profiler.ProfilerAction.RECORD
    ) as outer:
        with chiptrace.torch.profile() as inner:
            train_step()
            inner.step()
            train_step()
    assert outer.wait(60)
    assert outer.traces_imported == 1 and inner.traces_imported == 0
    names = {r["name"] for r in read_spans(trace_dir)}
    assert {"ProfilerStep#0", "ProfilerStep#1"} <= names


def test_a_trace_that_cannot_be_imported_is_counted_and_the_program_goes_on(
    trace_dir, train_step, caplog
):
    import chiptrace.torch

    with chiptrace.torch.profile() as prof:
        train_step()
        shutil.rmtree(trace_dir)  # nowhere to export the trace to: a file where the dir was
        trace_dir.write_text("")
    assert prof.wait(60)
    assert (prof.traces_imported, prof.traces_failed) == (0, 1)
    assert "profiler trace not imported" in caplog.text


def test_tracing_off_starts_no_profiler(tmp_path, train_step):
    import chiptrace.torch

    chiptrace.init(tmp_path / "off", enabled=False)
    try:
        with chiptrace.torch.profile() as prof:
            train_step()
            prof.step()
        assert prof.profiler is None and prof.traces_imported == 0
    finally:
        chiptrace.shutdown()
        chiptrace.init(tmp_path / "on")  # later tests start from tracing on
        chiptrace.shutdown()
