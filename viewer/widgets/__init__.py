"""The viewer's widgets, one per module."""

from __future__ import annotations

from chiptrace.viewer.widgets.alert_panel import AlertPanel
from chiptrace.viewer.widgets.chip_panel import ChipTypePanel
from chiptrace.viewer.widgets.dashboard import Dashboard
from chiptrace.viewer.widgets.explorer import Explorer
from chiptrace.viewer.widgets.help_screen import HelpScreen
from chiptrace.viewer.widgets.link_panel import LinkPanel
from chiptrace.viewer.widgets.slow_ops import SlowOpsPanel
from chiptrace.viewer.widgets.span_detail import SpanDetail
from chiptrace.viewer.widgets.sql_console import SqlConsole
from chiptrace.viewer.widgets.status_bar import StatusBar
from chiptrace.viewer.widgets.trace_list import TraceList
from chiptrace.viewer.widgets.waterfall import Waterfall, WaterfallRows

__all__ = [
    "AlertPanel",
    "ChipTypePanel",
    "Dashboard",
    "Explorer",
    "HelpScreen",
    "LinkPanel",
    "SlowOpsPanel",
    "SpanDetail",
    "SqlConsole",
    "StatusBar",
    "TraceList",
    "Waterfall",
    "WaterfallRows",
]
