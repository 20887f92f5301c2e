"""Step and training advice only where the trace shows training (issue 24, item 5): a
browser's trace gets where its time went and its long tasks, in its own words."""

from __future__ import annotations

import json

from chiptrace import connect, import_trace
from chiptrace.analysis import TraceAnalysis
from chiptrace.analysis.render_text import render_report

TRAINING_RULES = {"step-outliers", "straggler", "starvation", "launch-bound", "load-imbalance"}


def _browser(path):
    """A renderer's main thread: 40 message-loop tasks of ~2 ms (one of 120 ms, one of
    70 ms), each running a script and a layout under it; a compositor thread beside it."""
    ev = [{"ph": "M", "name": "process_name", "pid": 7, "tid": 0, "args": {"name": "Renderer"}}]
    t = 1_000_000
    for i in range(40):
        dur = {10: 120_000, 25: 70_000}.get(i, 2_000)
        ev.append(
            {
                "ph": "X",
                "name": "MessageLoop::RunTask",
                "pid": 7,
                "tid": 1,
                "ts": t,
                "dur": dur,
                "cat": "toplevel",
            }
        )
        ev.append(
            {
                "ph": "X",
                "name": "v8.run",
                "pid": 7,
                "tid": 1,
                "ts": t + 10,
                "dur": dur // 2,
                "cat": "v8",
            }
        )
        ev.append(
            {
                "ph": "X",
                "name": "Layout",
                "pid": 7,
                "tid": 1,
                "ts": t + 20 + dur // 2,
                "dur": dur // 4,
                "cat": "blink",
            }
        )
        ev.append(
            {
                "ph": "X",
                "name": "Composite",
                "pid": 7,
                "tid": 2,
                "ts": t + 100,
                "dur": 500,
                "cat": "cc",
            }
        )
        t += dur + 5_000
    path.write_text(json.dumps({"traceEvents": ev}))
    return path


def test_a_browser_trace_gets_no_training_advice(tmp_path):
    store = tmp_path / "store"
    import_trace(_browser(tmp_path / "trace.json"), store)
    rep = TraceAnalysis(store).report().to_dict()
    assert rep["workloads"] and not any(w["training"] for w in rep["workloads"])
    assert not [f for f in rep["findings"] if f["rule"] in TRAINING_RULES]
    assert rep["critical_path"] is None
    con = connect(store)
    ((n_long, over_ms),) = con.execute(
        "SELECT count(*), sum(duration_ns - 50e6) / 1e6 FROM spans "
        "WHERE parent_span_id IS NULL AND duration_ns >= 50e6"
    ).fetchall()
    (f,) = [f for f in rep["findings"] if f["rule"] == "long-tasks"]
    assert f["evidence"]["long_tasks"] == n_long == 2 and f["severity"] == "low"
    assert abs(f["evidence"]["over_50ms_ms"] - over_ms) < 1e-3
    assert f["culprit"] == "MessageLoop::RunTask" and f["step"] is None
    # where the time went: self time per process, thread and name, checked against SQL
    rows = {(r["thread"], r["name"]): r for r in rep["time_breakdown"]}
    ((task_ms, v8_ms, layout_ms),) = con.execute(
        "SELECT sum(duration_ns) FILTER (WHERE name = 'MessageLoop::RunTask') / 1e6, "
        "sum(duration_ns) FILTER (WHERE name = 'v8.run') / 1e6, "
        "sum(duration_ns) FILTER (WHERE name = 'Layout') / 1e6 FROM spans"
    ).fetchall()
    task = rows[("1", "MessageLoop::RunTask")]
    assert task["process"].startswith("Renderer") and task["count"] == 40
    assert abs(task["self_ms"] - (task_ms - v8_ms - layout_ms)) < 1e-3
    assert abs(rows[("1", "v8.run")]["self_ms"] - v8_ms) < 1e-3
    text = render_report(rep)
    assert "tasks 'MessageLoop::RunTask': 40" in text and "not training steps" in text
    assert "Time by process, thread and span" in text and "ms/step" not in text


def test_the_same_loop_with_a_step_attribute_is_training(builder, tmp_path):
    for i in range(6):
        tr = builder.new_trace()
        root = builder.span("train_step", i * 1000, i * 1000 + 900, trace=tr)
        builder.span("forward", i * 1000 + 10, i * 1000 + 800, trace=tr, parent=root)
    for r in builder.rows:
        r["attributes"] = json.dumps({"step": r["start_ns"]}) if not r["parent_span_id"] else None
    rep = TraceAnalysis(builder.write(tmp_path / "run")).report().to_dict()
    assert rep["workloads"][0]["training"] is True and rep["critical_path"] is not None


def _loop(builder, slow_step: int, tmp_path):
    """8 steps of a `train_step` span with a step attribute, 10 ms each on gpu:0, one 20x."""
    t = 0
    for i in range(8):
        dur = 200_000 if i == slow_step else 10_000
        tr = builder.new_trace()
        root = builder.span("train_step", t, t + dur, trace=tr)
        builder.span("fwd", t + 10, t + dur - 10, trace=tr, parent=root, chip="gpu:0")
        t += dur + 100
    for r in builder.rows:
        r["attributes"] = None
    roots = [r for r in builder.rows if not r["parent_span_id"]]
    for i, r in enumerate(roots):
        r["attributes"] = json.dumps({"step": i})
    return TraceAnalysis(builder.write(tmp_path / "run")).findings()


def test_only_the_first_step_slow_is_a_warm_up(builder, tmp_path):
    found = {f.rule: f for f in _loop(builder, 0, tmp_path)}
    assert "step-outliers" not in found
    assert found["warm-up"].severity == "info" and found["warm-up"].culprit == "train_step 0"


def test_a_slow_later_step_is_an_outlier_named_by_number(builder, tmp_path):
    found = {f.rule: f for f in _loop(builder, 5, tmp_path)}
    assert found["step-outliers"].evidence["slowest_step"] == "train_step 5"
    assert "warm-up" not in found
