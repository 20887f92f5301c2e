"""Pilot tests of what the viewer says and which keys it offers: LIVE becomes ENDED when
the source stops; the view keys work again after Escape leaves the SQL box; the footer
lists only the keys that work where the focus is."""

from __future__ import annotations

import threading
from pathlib import Path

from viewer_helpers import screen_text, some_refreshes, until

import chiptrace
from chiptrace.emulator import emulate
from chiptrace.viewer.app import ViewerApp
from chiptrace.viewer.sources import DirSource, FeedSource, SpanFeed
from chiptrace.viewer.widgets import SqlConsole


def _status(app: ViewerApp) -> str:
    return screen_text(app).splitlines()[2]  # under the header and the tabs


def _footer(app: ViewerApp) -> set[str]:
    return {
        b.binding.description
        for b in app.screen.active_bindings.values()
        if b.binding.show and b.enabled
    }


async def test_a_finished_trace_dir_says_ended(tmp_path: Path) -> None:
    r = emulate(steps=1, seed=1, out=tmp_path / "t", progress=False)
    app = ViewerApp([DirSource(r.out)], refresh_s=0.05, poll_s=0.05)
    async with app.run_test(size=(100, 30)) as pilot:
        await until(pilot, lambda: app.ended and "ENDED" in _status(app), "ENDED")
        assert app.model.spans_total == r.spans and "LIVE" not in _status(app)


async def test_a_dir_being_written_is_live_until_its_writer_ends(tmp_path: Path) -> None:
    out = tmp_path / "t"
    chiptrace.init(out, flush_interval_s=3600)
    try:
        with chiptrace.span("first", chip="gpu:0"):
            pass
        chiptrace.flush()
        app = ViewerApp([DirSource(out)], refresh_s=0.05, poll_s=0.05)
        async with app.run_test(size=(100, 30)) as pilot:
            await until(
                pilot, lambda: app.model.spans_total == 1 and "LIVE" in _status(app), "LIVE"
            )
            await some_refreshes(pilot)
            assert not app.ended  # the writer (this process) is alive and has not closed
            with chiptrace.span("last", chip="gpu:0"):
                pass
            chiptrace.shutdown()  # flush, then the manifest records the end
            await until(pilot, lambda: app.ended and "ENDED" in _status(app), "ENDED")
            assert app.model.spans_total == 2
    finally:
        chiptrace.shutdown()


async def test_an_in_process_feed_ends_when_its_producer_does(tmp_path: Path) -> None:
    done, feed = threading.Event(), SpanFeed()
    app = ViewerApp([FeedSource(name="feed", done=done)], feed=feed, refresh_s=0.05, poll_s=0.05)
    async with app.run_test(size=(100, 30)) as pilot:
        await some_refreshes(pilot)
        assert not app.ended and "LIVE" in _status(app)
        done.set()
        await until(pilot, lambda: "ENDED" in _status(app), "ENDED")
        app.paused = True
        await until(pilot, lambda: "PAUSED" in _status(app), "PAUSED")


async def test_view_keys_work_after_escape_from_the_sql_box(rack_dir: Path) -> None:
    app = ViewerApp([DirSource(rack_dir)])
    async with app.run_test(size=(100, 30)) as pilot:
        tabs = app.query_one("#tabs")
        for key, tab in (("d", "dashboard"), ("e", "explorer"), ("s", "sql")):
            await pilot.press("s")
            await pilot.press("d", "e")  # typed into the SQL box, not taken as keys
            assert tabs.active == "sql"
            assert app.query_one("#sql-input").value.endswith("de")
            await pilot.press("escape")
            await pilot.press(key)
            await until(pilot, lambda: tabs.active == tab, f"escape then {key!r}")  # noqa: B023
            assert tabs.active == tab, f"escape then {key!r} stayed on {tabs.active}"
        await pilot.press("escape", "d")
        await until(pilot, lambda: tabs.active == "dashboard", "escape then d")
        assert isinstance(app.query_one(SqlConsole), SqlConsole)


async def test_the_footer_lists_only_keys_that_work_here(rack_dir: Path) -> None:
    app = ViewerApp([DirSource(rack_dir)])
    async with app.run_test(size=(120, 30)) as pilot:
        await until(pilot, lambda: "Explore" in _footer(app), "the dashboard's footer")
        on_dash = _footer(app)
        assert {"Explore", "SQL", "Pause", "Zoom+", "Zoom-", "Quit"} <= on_dash
        assert "Dash" not in on_dash  # the tab already shown
        await pilot.press("e")
        await until(pilot, lambda: "Critical" in _footer(app), "the explorer's footer")
        in_explorer = _footer(app)
        assert {"Dash", "SQL", "Critical", "Quit"} <= in_explorer
        assert not {"Pause", "Zoom+", "Zoom-", "Explore"} & in_explorer
        await pilot.press("s")
        await until(pilot, lambda: "Keys" in _footer(app), "the SQL box's footer")
        typing = _footer(app)  # the SQL box takes letters as text
        assert "Keys" in typing
        assert not {"Dash", "Explore", "SQL", "Pause", "Quit", "Help"} & typing
        await pilot.press("escape")
        await until(pilot, lambda: "Quit" in _footer(app), "the keys back")
        assert {"Dash", "Explore", "Quit"} <= _footer(app)
        await pilot.press("q")  # and they work
        await until(pilot, lambda: not app.is_running, "the app to quit")
