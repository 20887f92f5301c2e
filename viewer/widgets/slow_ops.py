"""The slowest spans that ended in the window."""

from __future__ import annotations

from textual.markup import escape

from chiptrace.viewer.live_model import SlowSpan
from chiptrace.viewer.render import human_ns
from chiptrace.viewer.widgets.panel import Panel


class SlowOpsPanel(Panel):
    """Name, where it ran, and duration of the window's slowest spans."""

    def on_mount(self) -> None:
        self.border_title = "SLOWEST OPS"

    def show(self, spans: list[SlowSpan], limit: int = 6) -> None:
        if not spans:
            self.set_text("[$text-muted]no spans in this window[/]")
            return
        width = max(self.size.width, 30)
        name_w = max(8, width - 28)
        lines = [
            f"{escape(s.name[:name_w]):<{name_w}} {escape(s.where[:16]):<16} {human_ns(s.duration_ns):>9}"
            for s in spans[:limit]
        ]
        self.set_text("\n".join(lines))
