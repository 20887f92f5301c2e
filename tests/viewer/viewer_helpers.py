"""Viewer test helpers: the screen as plain text."""

from __future__ import annotations

import io

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
