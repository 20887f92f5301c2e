"""The link panel: throughput and saturation per link direction, busiest first."""

from __future__ import annotations

from chiptrace.viewer.live_model import SeriesRow
from chiptrace.viewer.render import bar, human_bytes_per_s, percent, sparkline
from chiptrace.viewer.widgets.panel import Panel

SHOW = 12  # a rack has thousands of link directions; the busiest fit, the rest are counted


def load(row: SeriesRow) -> float:
    """Saturation against the topology's bandwidth, or the busy share without one."""
    return row.saturation if row.saturation is not None else row.utilization


class LinkPanel(Panel):
    """Links by load; saturation against the topology's bandwidth when known, otherwise
    the busy fraction of the window (marked b)."""

    def on_mount(self) -> None:
        self.border_title = "LINKS"

    def show(self, links: list[SeriesRow]) -> None:
        if not links:
            self.set_text("[$text-muted]no link transfers in this source[/]")
            return
        order = sorted(links, key=lambda r: (-load(r), -r.bytes_per_s))[:SHOW]
        width = max(self.size.width - 1, 30)
        spark_w = 8 if width >= 64 else 0
        # name, rate (10), bar (>= 4), percent (4), busy mark (1), sparkline
        fixed = 1 + 10 + 1 + 4 + 1 + (spark_w + 1 if spark_w else 0)
        name_w = min(max(len(r.id) for r in order), max(10, width - fixed - 6))
        bar_w = max(4, width - fixed - name_w)
        lines = []
        for r in order:
            name = r.id if len(r.id) <= name_w else r.id[: name_w - 1] + "…"
            mark = " " if r.saturation is not None else "[$text-muted]b[/]"
            spark = f" {sparkline(r.history, spark_w)}" if spark_w else ""
            lines.append(
                f"{name:<{name_w}} {human_bytes_per_s(r.bytes_per_s):>10} "
                f"{bar(load(r), bar_w)}{percent(load(r))}{mark}{spark}"
            )
        if len(links) > SHOW:
            lines.append(f"[$text-muted]… {len(links) - SHOW:,} more link directions[/]")
        self.set_text("\n".join(lines))
