"""Live bottleneck alerts, most severe first."""

from __future__ import annotations

from textual.markup import escape

from chiptrace.viewer.alerts import Alert
from chiptrace.viewer.widgets.panel import Panel

_STYLE = {"high": "$error", "medium": "$warning", "low": "$text-muted", "info": "$text-muted"}


class AlertPanel(Panel):
    """One line per alert; says so when nothing stands out."""

    def on_mount(self) -> None:
        self.border_title = "ALERTS"

    def show(self, alerts: list[Alert]) -> None:
        self.set_class(bool(alerts), "-alerting")
        if not alerts:
            self.set_text("[$success]no bottleneck in this window[/]")
            return
        lines = [
            f"[b {_STYLE.get(a.severity, '')}]{a.severity[:4].upper():<4}[/] {escape(a.message)}"
            for a in alerts[:8]
        ]
        if len(alerts) > 8:
            lines.append(f"[$text-muted]… {len(alerts) - 8} more[/]")
        self.set_text("\n".join(lines))
