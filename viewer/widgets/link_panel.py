"""The link panel: throughput and saturation per link direction, with recent history."""

from __future__ import annotations

from chiptrace.viewer.model import SeriesRow
from chiptrace.viewer.render import bar, human_bytes_per_s, percent, sparkline
from textual.widgets import Static


class LinkPanel(Static):
    """Links by throughput; saturation against the topology's bandwidth when known,
    otherwise the busy fraction of the window."""

    def on_mount(self) -> None:
        self.border_title = "LINKS"

    def show(self, links: list[SeriesRow]) -> None:
        if not links:
            self.update("[$text-muted]no link transfers in this source[/]")
            return
        width = max(self.size.width, 30)
        name_w = min(max(len(r.id) for r in links), 22)
        spark_w = 8 if width >= 60 else 0
        bar_w = max(4, width - name_w - 10 - 6 - spark_w - 3)
        order = sorted(links, key=lambda r: -(r.saturation if r.saturation is not None else r.utilization))
        lines = []
        for r in order:
            load = r.saturation if r.saturation is not None else r.utilization
            mark = "" if r.saturation is not None else "[$text-muted]b[/]"
            spark = f" {sparkline(r.history, spark_w)}" if spark_w else ""
            lines.append(f"{r.id[-name_w:]:<{name_w}} {human_bytes_per_s(r.bytes_per_s)} "
                         f"{bar(load, bar_w)}{percent(load)}{mark}{spark}")  # fmt: skip
        self.update("\n".join(lines))
