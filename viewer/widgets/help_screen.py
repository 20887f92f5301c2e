"""The `?` screen: every key binding, grouped by view."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

HELP = """\
[b]chiptrace view[/] — live load across the rack's chips and links

[b]Everywhere[/] (the footer shows the keys that work where you are)
  [b]?[/]        this help              [b]q[/]  quit
  [b]d e s[/]    dashboard · explorer · SQL console
  [b]t[/]        toggle dark / light theme

[b]Dashboard[/]
  [b]p[/] pause / resume the screen (ingest keeps counting) · [b]+ -[/] zoom the time window
  status: LIVE, ENDED (the source stopped, all of it shown) or PAUSED
  bars: utilization over the window · sparklines: the windows before it
  links: throughput and % of bandwidth (topology), or busy % (marked b)
  alerts: saturated links, idle GPUs, stragglers, dropped spans

[b]Explorer[/]
  [b]enter[/] on a trace opens its waterfall · [b]r[/] reloads the list
  [b]↑ ↓ PgUp PgDn[/] select a span · [b][ ][/] zoom time · [b]c[/] next ◆ critical span

[b]SQL console[/]
  [b]enter[/] runs · [b]↑ ↓[/] history · [b]escape[/] hands the keys back · views: spans, chips, links, runs

[$text-muted]escape or ? to close[/]"""


class HelpScreen(ModalScreen[None]):
    """Key help over the current view."""

    BINDINGS = [Binding("escape,question_mark,q", "dismiss", "Close")]

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="help-box"):
            yield Static(HELP, id="help-text")
