"""Viewer test helpers: the screen as plain text, and waiting for the app."""

from __future__ import annotations

import io
import time

from rich.console import Console


def screen_text(app) -> str:  # noqa: ANN001
    """What the terminal shows now, as plain text (the SVG screenshot without styles)."""
    width, height = app.size
    console = Console(
        width=width,
        height=height,
        file=io.StringIO(),
        record=True,
        force_terminal=True,
        color_system="truecolor",
        legacy_windows=False,
    )
    console.print(
        app.screen._compositor.render_update(full=True, screen_stack=app._background_screens)
    )
    return console.export_text()


SETTLE_S = 60.0  # a loaded 2-core box; each wait ends as soon as its condition holds


async def until(pilot, ready, what: str, timeout_s: float = SETTLE_S) -> None:  # noqa: ANN001
    """Let the app run until `ready()` holds; fail naming `what` after `timeout_s`.

    The one way these tests wait: never a fixed pause, which is too short on a loaded
    machine and too long everywhere else."""
    deadline = time.monotonic() + timeout_s
    while not ready():
        if time.monotonic() > deadline:
            raise AssertionError(f"viewer did not settle: {what}")
        await pilot.pause(0.05)


async def some_refreshes(pilot, n: int = 5) -> None:  # noqa: ANN001
    """Let the app refresh its dashboard `n` more times: for checks that something did *not*
    happen (the source was not declared ended, nothing was read)."""
    app = pilot.app
    start = app.refreshes
    await until(pilot, lambda: app.refreshes >= start + n, f"{n} dashboard refreshes")


async def steady_screen(pilot, ignore: str = "spans/s") -> str:  # noqa: ANN001
    """The screen once two dashboard refreshes in a row draw the same text (lines
    holding `ignore`, a rate, left out): a shot taken while the app still lays out,
    repaints or ingests differs from the next one on a loaded machine."""
    app = pilot.app

    def text() -> str:
        return "\n".join(line for line in screen_text(app).splitlines() if ignore not in line)

    shots: list[str] = []

    def same_twice() -> bool:
        shots.append(text())
        return len(shots) >= 2 and shots[-1] == shots[-2]

    async def refreshed_and_same() -> bool:
        await some_refreshes(pilot, 1)
        return same_twice()

    deadline = time.monotonic() + SETTLE_S
    while not await refreshed_and_same():
        if time.monotonic() > deadline:
            raise AssertionError("viewer did not settle: the same screen twice in a row")
    return shots[-1]
