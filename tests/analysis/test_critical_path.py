"""Critical path: parent/child, OTel links (fan-out/fan-in), ordering on each chip."""

from __future__ import annotations

from pathlib import Path

from analysis_helpers import US, TraceBuilder

from chiptrace.analysis import TraceAnalysis, critical_path


def _names(path) -> list[str]:
    return [s.name for s in path.segments if s.via != "gap"]


def _fan_out_in(b: TraceBuilder) -> TraceBuilder:
    """A step: compute on gpu:0, then three transfers fan out at once; `reduce` on gpu:1
    waits on all three (OTel links) and the slowest (t2, 60 us) gates it."""
    t = b.new_trace()
    root = b.span("step", 0, 200, trace=t)
    fwd = b.span("fwd", 0, 50, trace=t, parent=root, chip="gpu:0")
    sends = [
        b.span(
            f"t{i}",
            50,
            50 + d,
            trace=t,
            parent=root,
            link=f"nvlink6:gpu:0-gpu:{i + 1}",
            src="gpu:0",
            dst=f"gpu:{i + 1}",
            nbytes=1 << 20,
            links=[fwd],
        )
        for i, d in enumerate((20, 30, 60))
    ]
    b.span("other", 55, 108, trace=t, parent=root, chip="gpu:2")  # ends after t2: a decoy
    b.span("reduce", 110, 190, trace=t, parent=root, chip="gpu:1", links=sends)
    return b


def test_fan_in_follows_the_last_transfer(tmp_path: Path, builder: TraceBuilder) -> None:
    d = _fan_out_in(builder).write(tmp_path / "t")
    path = TraceAnalysis(d).critical_path()
    assert _names(path) == ["fwd", "t2", "reduce"]
    assert sum(s.on_path_ns for s in path.segments) == path.duration_ns == 200 * US
    vias = {s.name: s.via for s in path.segments}
    assert vias["t2"] == "link" and vias["fwd"] == "link" and vias["reduce"] == "end"
    share = path.share("chip_type")
    assert abs(share["gpu"] - 130 / 200) < 1e-9 and abs(share["link"] - 60 / 200) < 1e-9
    assert abs(path.share("link_type")["nvlink6"] - 0.3) < 1e-9


def test_chip_order_is_a_dependency() -> None:
    rows = [
        {"span_id": "r", "parent_span_id": None, "name": "step", "start_ns": 0, "end_ns": 100},
        {
            "span_id": "a",
            "parent_span_id": "r",
            "name": "a",
            "start_ns": 0,
            "end_ns": 40,
            "chip_id": "gpu:0",
            "chip_type": "gpu",
        },
        {
            "span_id": "x",
            "parent_span_id": "r",
            "name": "x",
            "start_ns": 0,
            "end_ns": 45,
            "chip_id": "gpu:1",
            "chip_type": "gpu",
        },
        {
            "span_id": "b",
            "parent_span_id": "r",
            "name": "b",
            "start_ns": 40,
            "end_ns": 100,
            "chip_id": "gpu:0",
            "chip_type": "gpu",
        },
    ]
    path = critical_path(rows)
    # x ends later than a, but b started right when a (same chip) ended: a gated b
    assert _names(path) == ["a", "b"]
    assert [s.via for s in path.segments] == ["resource", "end"]


def test_sequential_host_code_and_gaps() -> None:
    rows = [
        {"span_id": "r", "parent_span_id": None, "name": "step", "start_ns": 0, "end_ns": 100_000},
        {
            "span_id": "l",
            "parent_span_id": "r",
            "name": "load",
            "start_ns": 5_000,
            "end_ns": 20_000,
            "chip_id": "cpu:0",
            "chip_type": "cpu",
        },
        {"span_id": "f", "parent_span_id": "r", "name": "fb", "start_ns": 30_000, "end_ns": 90_000},
        {
            "span_id": "m0",
            "parent_span_id": "f",
            "name": "mm0",
            "start_ns": 31_000,
            "end_ns": 60_000,
            "chip_id": "gpu:0",
            "chip_type": "gpu",
        },
        {
            "span_id": "m1",
            "parent_span_id": "f",
            "name": "mm1",
            "start_ns": 31_000,
            "end_ns": 88_000,
            "chip_id": "gpu:1",
            "chip_type": "gpu",
        },
    ]
    path = critical_path(rows)
    assert _names(path) == ["load", "mm1"]
    assert [s.via for s in path.segments] == ["gap", "sequence", "gap", "end", "gap"]
    assert sum(s.on_path_ns for s in path.segments) == 100_000
    assert abs(path.share("chip_type")["gap"] - 0.28) < 1e-9


def test_empty_and_single_span() -> None:
    assert critical_path([]).segments == ()
    p = critical_path(
        [{"span_id": "r", "parent_span_id": None, "name": "solo", "start_ns": 0, "end_ns": 10}]
    )
    assert _names(p) == ["solo"] and p.duration_ns == 10


def test_critical_path_of_any_step(tmp_path: Path) -> None:
    from analysis_helpers import training_run

    ta = TraceAnalysis(training_run(tmp_path / "t", steps=6, overlap=False), sample_steps=1)
    sampled = {p.trace_id for p in ta.critical_paths}
    other = next(t for t in ta.tables.steps.column("trace_id").to_pylist() if t not in sampled)
    path = ta.critical_path(other)
    assert path is not None and path.trace_id == other
    assert sum(s.on_path_ns for s in path.segments) == path.duration_ns
    # no overlap: the all-reduce runs after backward, so both sit on the path
    assert {"bwd", "allreduce"} <= {s.name for s in path.segments}
    assert ta.critical_path("0" * 32) is None


def test_loose_parentless_spans_get_a_virtual_root() -> None:
    """A trace of parentless chip spans (loose spans, or a root that was never collected):
    the path covers the whole trace, not just its longest span, and a one-span step on a
    chip works too (it once raised KeyError)."""
    rows = [
        {
            "span_id": "a",
            "parent_span_id": None,
            "name": "a",
            "start_ns": 0,
            "end_ns": 40,
            "chip_id": "gpu:0",
            "chip_type": "gpu",
        },
        {
            "span_id": "b",
            "parent_span_id": "gone",
            "name": "b",
            "start_ns": 40,
            "end_ns": 100,
            "chip_id": "gpu:0",
            "chip_type": "gpu",
        },
        {
            "span_id": "c",
            "parent_span_id": None,
            "name": "c",
            "start_ns": 110,
            "end_ns": 150,
            "chip_id": "gpu:1",
            "chip_type": "gpu",
        },
    ]
    path = critical_path(rows)
    assert path.root == "(trace)" and (path.start_ns, path.end_ns) == (0, 150)
    assert _names(path) == ["a", "b", "c"]
    assert sum(s.on_path_ns for s in path.segments) == 150
    one = critical_path(rows[:1])
    assert _names(one) == ["a"] and one.duration_ns == 40
