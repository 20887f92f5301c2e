"""The live dashboard: status line, a panel per chip type, links, alerts, slowest ops."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical, VerticalScroll

from chiptrace.schema import CHIP_TYPES
from chiptrace.viewer.alerts import Alert
from chiptrace.viewer.live_model import Snapshot
from chiptrace.viewer.widgets.alert_panel import AlertPanel
from chiptrace.viewer.widgets.chip_panel import ChipTypePanel
from chiptrace.viewer.widgets.link_panel import LinkPanel
from chiptrace.viewer.widgets.slow_ops import SlowOpsPanel
from chiptrace.viewer.widgets.status_bar import StatusBar


class Dashboard(Vertical):
    """Draws a Snapshot; holds no state of its own."""

    def compose(self) -> ComposeResult:
        yield StatusBar("waiting for spans…", id="status")
        with Horizontal(id="dash-body"):
            with VerticalScroll(id="chips-column"):
                for t in CHIP_TYPES:
                    yield ChipTypePanel(t)
            with VerticalScroll(id="side-column"):
                yield AlertPanel("", id="alerts")
                yield LinkPanel("", id="links")
                yield SlowOpsPanel("", id="slowest")

    def on_mount(self) -> None:
        # Found once: a CSS query per panel per refresh costs more than drawing it.
        self._panels = list(self.query(ChipTypePanel))
        self._status = self.query_one(StatusBar)
        self._links = self.query_one(LinkPanel)
        self._alerts = self.query_one(AlertPanel)
        self._slowest = self.query_one(SlowOpsPanel)

    def show(self, snap: Snapshot, alerts: list[Alert], source: str, state: str) -> None:
        """Redraw every panel from one snapshot (a no-op until the panels are mounted).

        Args:
            state: LIVE, ENDED or PAUSED, for the status line.
        """
        if not hasattr(self, "_status"):
            return
        self._status.show(snap, source, state)
        if snap.empty:  # no figure yet rather than 0%: a store being read, a run starting
            waiting = "loading the newest parts…" if snap.unread else "waiting for spans…"
            for p in (*self._panels, self._links, self._alerts, self._slowest):
                p.set_text(f"[$text-muted]{waiting}[/]")
            return
        for panel in self._panels:
            panel.show(snap.chips.get(panel.chip_type, []))
        self._links.show(snap.links)
        self._alerts.show(alerts)
        self._slowest.show(snap.slowest)
