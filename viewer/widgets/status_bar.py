"""One line of ingest figures: state (LIVE, ENDED, PAUSED), source, window, spans/s, dropped."""

from __future__ import annotations

from textual.markup import escape

from chiptrace.viewer.live_model import Snapshot
from chiptrace.viewer.render import human_count, human_ns
from chiptrace.viewer.widgets.panel import Panel

_COLORS = {"LIVE": "$success", "LOADING": "$accent", "PAUSED": "$warning", "ENDED": "$text-muted"}


class StatusBar(Panel):
    """The dashboard's top line."""

    def show(self, snap: Snapshot, source: str, state: str) -> None:
        """Draw the line; `state` is LIVE, ENDED (the sources stopped) or PAUSED."""
        color = _COLORS.get(state, "$text")
        state = f"[b {color}]{escape(state)}[/] "
        dropped = f"[b $error]{snap.dropped:,}[/]" if snap.dropped else "0"
        window = human_ns(snap.window_ns)
        if snap.loading:  # the window starts where the spans not read yet end
            shown = human_ns(snap.until_ns - snap.since_ns) if snap.covered else "none"
            window = f"{shown} of {window}"
        seen = f"{human_count(snap.spans_total)} seen"
        if snap.unread:
            seen = f"{human_count(snap.spans_total)} of {human_count(snap.spans_total + snap.unread)} read"
        self.set_text(
            f"{state}{escape(source[-28:])}  window {window}  "
            f"[b]{human_count(snap.spans_per_s)}[/] spans/s  {seen}  dropped {dropped}"
        )
