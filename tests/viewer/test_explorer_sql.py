"""Pilot tests of the trace explorer (waterfall, critical path, span details) and SQL console."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from viewer_helpers import screen_text, until

from chiptrace.viewer.app import ViewerApp
from chiptrace.viewer.sources import DirSource
from chiptrace.viewer.widgets import SpanDetail, SqlConsole, Waterfall, WaterfallRows


async def test_waterfall_opens_on_a_trace(rack_dir: Path) -> None:
    app = ViewerApp([DirSource(rack_dir)])
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("e")
        wf = app.query_one(Waterfall)
        await until(pilot, lambda: wf.data is not None, "a trace laid out")
        rows = wf.data
        assert int((rows.rows >= 0).sum()) == 812  # every span of the step has a row
        assert rows.critical.any()
        # Lanes by chip and link, each a header row.
        lanes = set(rows.header_lane.values())
        assert {"gpu:0", "npu:0", "switch:0", "nvlink6:gpu:0-gpu:1"} <= lanes
        await until(pilot, lambda: "critical path" in screen_text(app), "the explorer status")
        text = screen_text(app)
        assert wf.lanes and "gpu:0 " in text and "█" in text  # Gantt: a row per chip/link
        await pilot.press("c")  # jump to a critical-path span: details say so
        detail = app.query_one(SpanDetail)
        await until(pilot, lambda: "critical path" in str(detail.render()), "span details")
        assert rows.critical[wf.selected]
        assert "critical path" in str(detail.render())
        before = wf.selected
        await pilot.press("right")  # the next span in the same lane
        assert rows.lane_of[wf.selected] == rows.lane_of[before] and wf.selected != before
        await pilot.press("down")
        assert rows.lane_of[wf.selected] == rows.lane_of[before] + 1
        await pilot.press("right_square_bracket")
        assert wf.view[1] - wf.view[0] < rows.t1 - rows.t0
        await pilot.press("g")  # a row per span, under lane headers
        await until(pilot, lambda: not wf.lanes, "a row per span")
        assert not wf.lanes and rows.rows[wf.cursor] == wf.selected
        assert "▾ " in screen_text(app)


def test_waterfall_rows_lazy_at_100k_spans() -> None:
    n = 100_000
    rng = np.random.default_rng(3)
    start = np.sort(rng.integers(0, 10**9, n))
    chips = pa.array([f"gpu:{i % 8}" for i in range(n)]).dictionary_encode()
    table = pa.table(
        {
            "span_id": [f"{i:016x}" for i in range(n)],
            "name": pa.array(["op"] * n),
            "start_ns": start,
            "end_ns": start + 1000,
            "chip_id": chips,
            "link_id": pa.nulls(n, pa.string()),
        }
    )
    rows = WaterfallRows(table, {"0000000000000001"})
    assert len(rows) == n + 8  # spans plus one header per lane
    assert rows.critical.sum() == 1


async def test_sql_console_runs_and_shows_errors(rack_dir: Path) -> None:
    app = ViewerApp([DirSource(rack_dir)])
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("s")
        console = app.query_one(SqlConsole)
        box = app.query_one("#sql-input")
        # The tab moves the focus to the input a moment later: keys typed before would go
        # to the app's bindings (s, e, t, ...), not into the query.
        await until(pilot, lambda: app.focused is box, "the SQL input focused")
        await pilot.press(*"select count(*) as n from spans")
        await until(
            pilot, lambda: box.value == "select count(*) as n from spans", "the query typed"
        )
        await pilot.press("enter")
        grid = app.query_one("#sql-result")
        await until(pilot, lambda: grid.row_count == 1, "the query result")
        await until(pilot, lambda: "8120" in screen_text(app), "the result on screen")
        box.value = "selec nonsense"
        await until(pilot, lambda: app.focused is box, "the SQL input still focused")
        await pilot.press("enter")
        await until(pilot, lambda: console.has_class("-error"), "the query error")
        await until(pilot, lambda: "SQL error" in screen_text(app), "the error on screen")
        await pilot.press("up")
        await until(pilot, lambda: box.value == "selec nonsense", "the last query back")
        await pilot.press("up")
        await until(
            pilot, lambda: box.value == "select count(*) as n from spans", "the first query back"
        )


def test_critical_path_is_the_reports_or_an_error(rack_dir: Path) -> None:
    from chiptrace.analysis.critical_path import critical_path
    from chiptrace.viewer.queries import LiveStore, critical_span_ids

    store = LiveStore(rack_dir)
    trace = store.traces()["trace_id"][0].as_py()
    spans = store.trace_spans(trace)
    ids, error = critical_span_ids(spans)
    want = {s.span_id for s in critical_path(spans.to_pylist()).segments if s.span_id}
    assert error is None and ids == want and ids
    store.close()
    # Input the analysis cannot walk: no path, and the reason for the status line (there is
    # no second, simpler walk to fall back on).
    ids, error = critical_span_ids(pa.table({"span_id": ["a"], "name": ["x"]}))
    assert ids == set() and error and error.startswith("KeyError")


def test_closing_the_store_stops_a_running_query_and_takes_no_more(rack_dir: Path) -> None:
    """Quitting must not wait for a worker's query (the analysis rules over a 100M-span
    store run ~10 s), nor let a worker that starts as the viewer quits open a new one."""
    from chiptrace.errors import ChiptraceError, StoreError
    from chiptrace.viewer.queries import LiveStore

    store = LiveStore(rack_dir)
    store.sql("SELECT count(*) FROM spans")  # connected
    raised: list[BaseException] = []

    def endless() -> None:  # ~1000 s of summing without the interrupt
        try:
            store.sql("SELECT sum(i) FROM range(1000000000000) t(i)")
        except ChiptraceError as e:
            raised.append(e)

    worker = threading.Thread(target=endless)
    worker.start()
    deadline = time.monotonic() + 60
    while not store._lock.locked() and worker.is_alive() and time.monotonic() < deadline:
        time.sleep(0.01)  # until the query holds the connection
    store.close()
    worker.join(timeout=60)
    assert not worker.is_alive() and raised, "the query was not stopped"
    with pytest.raises(StoreError, match="closing"):
        store.sql("SELECT 1")
