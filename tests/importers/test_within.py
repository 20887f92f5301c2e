"""Importing into a recorded run: events nest under the run's spans that enclose them."""

from __future__ import annotations

import numpy as np

import chiptrace
from chiptrace.importers.within import OPEN_NS, Within
from tests.importers.conftest import KINETO

RANK0 = KINETO / "2rank_sampled_rank-0.json.gz"
EPOCH, STEP = 0xE90C, 0x57E9
EPOCH_TRACE, STEP_TRACE = bytes(range(16)), bytes(range(16, 32))


def _rows(out) -> list[dict]:
    con = chiptrace.connect(out)
    return con.sql("SELECT * FROM spans").to_arrow_table().to_pylist()


def _chain(row: dict, by_id: dict) -> list[str]:
    """Span ids from the row's parent up to the first parent not among `by_id`."""
    out = []
    parent = row["parent_span_id"]
    while parent is not None:
        out.append(parent)
        if parent not in by_id:
            break
        parent = by_id[parent]["parent_span_id"]
    return out


def _within(step_start: int, step_end: int, first: int) -> Within:
    """A run with an `epoch` span open around everything and a `step` span that starts
    just inside profiler step 2 (so it is the deeper of the two) and ends with it."""
    return Within(
        trace_id=np.frombuffer(EPOCH_TRACE + STEP_TRACE, np.uint8).reshape(2, 16),
        span_id=np.array([EPOCH, STEP], np.uint64),
        start=np.array([first - 1000, step_start + 1000], np.int64),
        end=np.array([OPEN_NS, step_end], np.int64),
        service="train",
        host="node7",
        resource={"service.name": "train", "team": "x"},
        run_id="run-1",
    )


def test_events_hang_under_the_run_spans_that_enclose_them(tmp_path):
    plain = tmp_path / "plain"
    chiptrace.import_trace(RANK0, plain)
    con = chiptrace.connect(plain)
    first = con.execute("SELECT min(start_ns) FROM spans").fetchone()[0]
    name, s0, s1 = con.execute(
        "SELECT name, start_ns, end_ns FROM spans WHERE name LIKE 'ProfilerStep#%' "
        "ORDER BY start_ns LIMIT 1 OFFSET 1"
    ).fetchone()
    out = tmp_path / "run"
    chiptrace.import_trace(RANK0, out, within=_within(s0, s1, first))

    rows = _rows(out)
    by_id = {r["span_id"]: r for r in rows}
    step_id, epoch_id = f"{STEP:016x}", f"{EPOCH:016x}"  # the spans view shows hex
    assert not [r for r in rows if r["parent_span_id"] is None]  # all under the run
    for r in rows:
        chain = _chain(r, by_id)
        assert chain[-1] in (step_id, epoch_id), r["name"]
        trace = (STEP_TRACE if step_id in chain else EPOCH_TRACE).hex()
        assert r["trace_id"] == trace, r["name"]
    # Host work inside the step span is under it; the profiler step itself is not.
    inside = [
        r
        for r in rows
        if r["chip_id"] == "cpu:0" and r["start_ns"] >= s0 + 1000 and r["end_ns"] <= s1
    ]
    assert len(inside) > 100
    assert all(step_id in _chain(r, by_id) for r in inside)
    step_span = next(r for r in rows if r["name"] == name)
    assert step_span["parent_span_id"] == epoch_id
    # A kernel launched inside the step span is under it, wherever it ran.
    launched = {r["span_id"]: r for r in inside if r["op_kind"] == "launch"}
    kernels = [r for r in rows if r["chip_id"] == "gpu:0" and r["links"] and _linked(r) in launched]
    assert kernels
    assert all(step_id in _chain(r, by_id) for r in kernels)
    # The run's identity, the file's rank kept, chips named as the run names them.
    assert {r["service"] for r in rows} == {"train"}
    assert {r["host"] for r in rows} == {"node7"}
    assert not [r for r in rows if r["chip_id"] and "/" in r["chip_id"]]
    resource = chiptrace.connect(out).execute("SELECT DISTINCT resource FROM spans").fetchall()
    assert len(resource) == 1 and '"team":"x"' in resource[0][0]
    assert '"distributed.rank":0' in resource[0][0]


def _linked(row: dict) -> str:
    import json

    return json.loads(row["links"])[0]["span_id"]


def test_enclosing_picks_the_innermost_span():
    within = Within(
        trace_id=np.zeros((4, 16), np.uint8),
        span_id=np.arange(1, 5, dtype=np.uint64),
        # 0 holds 1 and 3; 1 holds 2; 3 overlaps nothing else
        start=np.array([0, 10, 20, 60], np.int64),
        end=np.array([100, 50, 30, 90], np.int64),
        service="s",
        host="h",
    )
    start = np.array([21, 31, 55, 61, 95, 200, -5], np.int64)
    end = np.array([29, 49, 58, 70, 99, 300, 1], np.int64)
    assert within.enclosing(start, end).tolist() == [2, 1, 0, 3, 0, -1, -1]
