"""The selected span's columns and attributes."""

from __future__ import annotations

from typing import Any

from textual.markup import escape
from textual.widgets import Static

from chiptrace.viewer.queries import span_details
from chiptrace.viewer.render import human_ns


class SpanDetail(Static):
    """Key/value lines of one span; the critical-path flag first."""

    def on_mount(self) -> None:
        self.border_title = "SPAN"
        self.update("[$text-muted]select a span[/]")

    def show(self, row: dict[str, Any]) -> None:
        head = [f"[b]{escape(str(row.get('name')))}[/]"]
        if row.get("_critical"):
            head.append("[b $error]◆ on the critical path[/]")
        dur = row.get("duration_ns") or (row.get("end_ns", 0) - row.get("start_ns", 0))
        head.append(f"duration [b]{human_ns(dur)}[/]")
        lines = [
            f"[$text-muted]{escape(k)}[/] {escape(v[:200])}"
            for k, v in span_details(row)
            if k not in ("name", "duration_ns")
        ]
        self.update("\n".join(head + lines))
