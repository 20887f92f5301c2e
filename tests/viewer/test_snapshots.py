"""SVG snapshots of every screen of the viewer (pytest-textual-snapshot), so a change in
drawing fails a test. The SVGs are in tests/viewer/__snapshots__/test_snapshots/; after an
intended change, look at them and accept with `pytest tests/viewer/test_snapshots.py
--snapshot-update`.

The screens are drawn from a finished emulated run (fixed seed, fixed faults), as `chiptrace
view DIR` opens it, at a fixed terminal size, once the app has settled: every span ingested,
the source ENDED, the ingest rate (a 2 s wall-clock average) back to 0. The analysis rules
are off (`analysis_s=0`): their findings are the analysis's wording, tested in
tests/analysis; the viewer's own alerts are drawn.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
from viewer_helpers import until

import chiptrace
from chiptrace.emulator import emulate
from chiptrace.viewer.app import ViewerApp
from chiptrace.viewer.launch import dir_app

SIZE = (120, 36)
# The status line shows the source's last 28 characters: a longer fixed name keeps the
# temporary path out of the picture.
STORE_NAME = "viewer-snapshots-rack6-mixed-seed1"
QUERY = "SELECT chip_type, count(*) AS spans FROM spans GROUP BY ALL ORDER BY spans DESC, 1"

Pilot = object  # textual.pilot.Pilot, kept out of the annotations' imports


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two steps of the mixed workload on rack6 with a 4x slow gpu:3 and a thin DPU."""
    out = tmp_path_factory.mktemp("snapshots") / STORE_NAME
    faults = ["slow:gpu:3:4", "slow:dpu:1:8"]
    emulate(
        topology="rack6", workload="mixed", steps=2, seed=1, faults=faults, out=out, progress=False
    )
    return out


@pytest.fixture(scope="module")
def span_count(store: Path) -> int:
    return chiptrace.connect(store).sql("SELECT count(*) FROM spans").fetchall()[0][0]


def viewer(store: Path) -> ViewerApp:
    app = dir_app(store)
    app.analysis_s = 0
    return app


def settled_dashboard(total: int) -> Callable[[object], Awaitable[None]]:
    async def run_before(pilot) -> None:  # noqa: ANN001
        app = pilot.app

        def done() -> bool:
            snap = app.snapshot
            return bool(app.ended and app.model.spans_total == total and snap)

        await until(pilot, done, "all spans ingested and the source ENDED")
        await until(pilot, lambda: app.model.snapshot(app.window_ns).spans_per_s == 0, "rate 0")
        app.refresh_dashboard()
        await pilot.pause()

    return run_before


def opened_trace(store: Path, root: str, total: int) -> Callable[[object], Awaitable[None]]:
    """The explorer with the first trace rooted at `root` laid out in the waterfall, once
    every span is in and the source has ENDED (the status line is in the picture)."""
    (trace_id,) = (
        chiptrace.connect(store)
        .sql(f"SELECT trace_id FROM spans WHERE name = '{root}' ORDER BY start_ns LIMIT 1")
        .fetchall()[0]
    )

    async def run_before(pilot) -> None:  # noqa: ANN001
        app = pilot.app
        await settled_dashboard(total)(pilot)
        await pilot.press("e")
        explorer = app.query_one("#explorer-view")
        trace_list = app.query_one("#trace-list")
        await until(pilot, lambda: trace_list.row_count > 0, "trace list loaded")
        await until(pilot, lambda: explorer.trace_id is not None, "first trace opening")
        await until(pilot, lambda: _loaded(app, explorer.trace_id), "first trace laid out")
        explorer.open_trace(trace_id)
        await until(pilot, lambda: _loaded(app, trace_id), f"trace {trace_id} laid out")

    return run_before


def _loaded(app: ViewerApp, trace_id: str) -> bool:
    status = str(app.query_one("#explorer-status").render())
    return status.startswith(f"trace {trace_id[:16]}")


def test_dashboard(snap_compare, store: Path, span_count: int) -> None:  # noqa: ANN001
    assert snap_compare(viewer(store), terminal_size=SIZE, run_before=settled_dashboard(span_count))


def test_dashboard_80x24(snap_compare, store: Path, span_count: int) -> None:  # noqa: ANN001
    """Every view works at 80x24 (docs/viewer.md)."""
    app = viewer(store)
    assert snap_compare(app, terminal_size=(80, 24), run_before=settled_dashboard(span_count))


def test_help_over_dashboard(snap_compare, store: Path, span_count: int) -> None:  # noqa: ANN001
    app = viewer(store)
    run_before = settled_dashboard(span_count)
    assert snap_compare(app, press=["question_mark"], terminal_size=SIZE, run_before=run_before)


def test_explorer_waterfall(snap_compare, store: Path, span_count: int) -> None:  # noqa: ANN001
    """A training step's lanes, the critical path marked, the next critical span selected."""
    run_before = opened_trace(store, "train_step", span_count)
    assert snap_compare(viewer(store), press=["c"], terminal_size=SIZE, run_before=run_before)


def test_explorer_span_rows(snap_compare, store: Path, span_count: int) -> None:  # noqa: ANN001
    """`g`: a row per span under lane headers."""
    run_before = opened_trace(store, "train_step", span_count)
    app = viewer(store)
    assert snap_compare(app, press=["g", "down", "down"], terminal_size=SIZE, run_before=run_before)


def _sql(sql: str, total: int) -> Callable[[object], Awaitable[None]]:
    async def run_before(pilot) -> None:  # noqa: ANN001
        app = pilot.app
        await settled_dashboard(total)(pilot)  # the status line is in the picture
        await pilot.press("s")
        status = app.query_one("#sql-status")
        before = str(status.render())
        box = app.query_one("#sql-input")
        box.cursor_blink = False  # a blinking cursor is in the picture half of the time
        box.value = sql
        await pilot.press("enter")
        await until(
            pilot,
            lambda: str(status.render()) not in (before, "running…"),
            "query answered",
        )

    return run_before


def test_sql_console_result(snap_compare, store: Path, span_count: int) -> None:  # noqa: ANN001
    assert snap_compare(viewer(store), terminal_size=SIZE, run_before=_sql(QUERY, span_count))


def test_sql_console_error(snap_compare, store: Path, span_count: int) -> None:  # noqa: ANN001
    """An error shows in place of the row count, in the error colour."""
    run_before = _sql("SELECT no_such_column FROM spans", span_count)
    assert snap_compare(viewer(store), terminal_size=SIZE, run_before=run_before)
