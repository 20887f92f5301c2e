"""One chip type's panel: a bar (utilization over the window) and a sparkline per chip."""

from __future__ import annotations

from typing import Any

import numpy as np

from chiptrace.viewer.live_model import SeriesRow
from chiptrace.viewer.render import bar, percent, sparkline
from chiptrace.viewer.widgets.panel import Panel


class ChipTypePanel(Panel):
    """The chips of one type (gpu, cpu, dpu, npu, nic or switch).

    A type the source has no chips of says so, instead of drawing empty bars.
    """

    def __init__(self, chip_type: str, **kwargs: Any) -> None:
        super().__init__("", id=f"chips-{chip_type}", classes="chip-panel", **kwargs)
        self.chip_type = chip_type
        self.border_title = chip_type.upper()

    def show(self, rows: list[SeriesRow]) -> None:
        """Redraw from the snapshot's rows for this type."""
        self.set_class(not rows, "-none")
        if not rows:
            self.border_subtitle = ""
            self.set_text(f"[$text-muted]no {self.chip_type} chips in this source[/]")
            return
        mean = float(np.mean([r.utilization for r in rows]))
        self.border_title = f"{self.chip_type.upper()} ×{len(rows)}  avg {percent(mean).strip()}"
        width = max(self.size.width, 30)
        name_w = min(max(len(r.id) for r in rows), 14)
        spark_w = max(4, min(24, (width - name_w - 7) // 2))
        bar_w = max(4, width - name_w - 7 - spark_w)
        lines = [
            f"{r.id[-name_w:]:<{name_w}} {bar(r.utilization, bar_w)} {percent(r.utilization)} "
            f"{sparkline(r.history, spark_w)}"
            for r in rows
        ]
        self.set_text("\n".join(lines))
