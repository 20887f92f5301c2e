"""Pilot tests of the live dashboard over real trace dirs, checked against DuckDB."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from viewer_helpers import screen_text, some_refreshes, steady_screen, until
from viewer_rack import LOAD, SATURATED, STEP_NS, sql_utilization, write_rack

import chiptrace
from chiptrace.schema import CHIP_TYPES
from chiptrace.viewer.app import ViewerApp
from chiptrace.viewer.sources import DirSource

WINDOW_NS = STEP_NS  # one step: 100 ms, ten 10 ms buckets


async def _settle(app: ViewerApp, pilot, spans: int) -> None:  # noqa: ANN001
    await until(pilot, lambda: app.model.spans_total >= spans, f"{spans} spans ingested")
    app.refresh_dashboard()
    await pilot.pause()


async def test_six_chip_types_agree_with_sql(rack_dir: Path) -> None:
    total = chiptrace.connect(rack_dir).sql("SELECT count(*) FROM spans").fetchall()[0][0]
    app = ViewerApp([DirSource(rack_dir)], window_ns=WINDOW_NS)
    async with app.run_test(size=(80, 24)) as pilot:
        await _settle(app, pilot, total)
        snap = app.snapshot
        text = screen_text(app)
        for chip_type in CHIP_TYPES:
            assert chip_type.upper() in text, f"{chip_type} panel missing"
            assert snap.chips[chip_type], f"no {chip_type} chips"
        expected = sql_utilization(rack_dir, snap.since_ns, snap.until_ns)
        shown = {r.id: r.utilization for rows in snap.chips.values() for r in rows}
        assert set(shown) == set(LOAD)
        for chip, u in shown.items():
            assert u == pytest.approx(expected.get(chip, 0.0), abs=1e-6), chip
            assert u == pytest.approx(LOAD[chip], abs=1e-6)
        # The bars' percentages are on screen too.
        assert re.search(r"gpu:0 .* 80%", text)
        assert re.search(r"npu:0 .* 50%", text)


async def test_missing_chip_type_says_so(tmp_path: Path) -> None:
    import viewer_rack as rack
    from viewer_rack import TOPOLOGY

    saved = dict(rack.LOAD)
    rack.LOAD.pop("switch:0")
    topo_chips = list(TOPOLOGY["chips"])
    TOPOLOGY["chips"] = [c for c in topo_chips if c["type"] != "switch"]
    try:
        d = write_rack(tmp_path / "noswitch", steps=2, parts=1)
    finally:
        rack.LOAD.clear()
        rack.LOAD.update(saved)
        TOPOLOGY["chips"] = topo_chips
    app = ViewerApp([DirSource(d)], window_ns=WINDOW_NS)
    async with app.run_test(size=(100, 40)) as pilot:
        await _settle(app, pilot, 1)
        assert "no switch chips in this source" in screen_text(app)


async def test_injected_faults_raise_alerts(rack_dir: Path) -> None:
    app = ViewerApp([DirSource(rack_dir)], window_ns=WINDOW_NS)
    async with app.run_test(size=(100, 30)) as pilot:
        await _settle(app, pilot, 100)
        rules = {(a.rule, a.culprit) for a in app.alerts}
        assert ("link-saturated", SATURATED) in rules
        assert ("idle-gpu", "gpu:3") in rules
        assert not any(a.culprit == "pcie5:cpu:0-gpu:0" for a in app.alerts)
        text = screen_text(app)
        assert "gpu:3 idle" in text
        assert "95% of its bandwidth" in text


async def test_follows_parts_as_they_land(tmp_path: Path) -> None:
    d = tmp_path / "live"
    app = ViewerApp([DirSource(d)], window_ns=WINDOW_NS, poll_s=0.05)
    async with app.run_test(size=(80, 24)) as pilot:
        await some_refreshes(pilot)
        assert app.model.spans_total == 0
        assert "waiting" in screen_text(app) or app.snapshot.empty
        write_rack(d, steps=2, parts=1)
        await _settle(app, pilot, 1)
        first = app.model.spans_total
        assert first > 0
        write_rack(d, steps=4, parts=1)  # a second writer: its parts only are read
        await _settle(app, pilot, first + 1)
        assert app.model.spans_total == first * 3


async def test_pause_freezes_and_zoom_changes_window(rack_dir: Path) -> None:
    app = ViewerApp([DirSource(rack_dir)], window_ns=WINDOW_NS)
    async with app.run_test(size=(80, 24)) as pilot:
        await _settle(app, pilot, 100)
        before = app.window_ns
        await pilot.press("minus")
        assert app.window_ns > before
        await pilot.press("plus")
        assert app.window_ns == before
        await pilot.press("p")
        assert app.paused and "PAUSED" in screen_text(app)
        n = app.refreshes
        app.refresh_dashboard()
        assert app.refreshes == n
        await pilot.press("p")
        assert not app.paused
        await pilot.press("question_mark")
        await pilot.pause()
        assert "pause / resume" in screen_text(app)
        await pilot.press("escape")


async def test_analysis_rules_run_over_the_window(rack_dir: Path) -> None:
    app = ViewerApp([DirSource(rack_dir)], window_ns=WINDOW_NS, analysis_s=0)
    async with app.run_test(size=(100, 30)) as pilot:
        await _settle(app, pilot, 100)
        app.run_analysis()
        await until(pilot, lambda: app.deep_alerts, "the analysis' findings")
        app.refresh_dashboard()
        await pilot.pause()
        assert ("link-bound", SATURATED) in {(a.rule, a.culprit) for a in app.alerts}
        assert ("idle-gpu", "gpu:3") in {(a.rule, a.culprit) for a in app.alerts}


async def test_dark_and_light_themes_render_the_same_dashboard(rack_dir: Path) -> None:
    total = chiptrace.connect(rack_dir).sql("SELECT count(*) FROM spans").fetchall()[0][0]
    app = ViewerApp([DirSource(rack_dir)], window_ns=WINDOW_NS, analysis_s=0)
    async with app.run_test(size=(80, 24)) as pilot:
        # Every span in, and the screen the same over two refreshes, before each shot: a
        # dashboard still ingesting or repainting differs between the two shots.
        await _settle(app, pilot, total)
        dark_text = await steady_screen(pilot)
        dark_svg = app.export_screenshot()
        await pilot.press("t")
        await until(pilot, lambda: not app.current_theme.dark, "the light theme")
        # The theme's colours reach the screen at a later repaint: wait for them.
        await until(pilot, lambda: app.export_screenshot() != dark_svg, "the light colours")
        light_text = await steady_screen(pilot)
        light_svg = app.export_screenshot()
    assert dark_svg != light_svg  # colours follow the theme ...
    assert dark_text == light_text  # ... text does not (the spans/s line left out)
    assert "GPU" in light_svg and "ALERTS" in light_svg
