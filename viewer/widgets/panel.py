"""A Static that redraws only when its text changed: most panels repeat between refreshes
(a paused feed, a finished run, idle chips), and an unchanged panel then costs nothing."""

from __future__ import annotations

from textual.widgets import Static


class Panel(Static):
    """Base of the dashboard panels: `set_text(markup)` instead of `update`."""

    _text: str | None = None

    def set_text(self, text: str) -> None:
        if text != self._text:
            self._text = text
            self.update(text)
