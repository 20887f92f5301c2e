"""The waterfall: one trace's spans as Gantt bars, grouped in rows by chip and link.

Rows are laid out once per trace with NumPy (a lane header, then that lane's spans by
start time) and drawn lazily with Textual's Line API: `render_line` builds only the rows
on screen, so a 100,000-span trace costs the same to scroll as a 100-span one.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
from chiptrace.viewer.render import human_ns
from rich.segment import Segment
from rich.style import Style
from textual.binding import Binding
from textual.geometry import Region, Size
from textual.message import Message
from textual.reactive import reactive
from textual.scroll_view import ScrollView
from textual.strip import Strip

LABEL_MAX = 28


class WaterfallRows:
    """The laid-out rows of one trace: for each row, a span index or -1 for a lane header.

    Args:
        spans: the trace's spans (columns as `queries.TRACE_SPANS_SQL` selects them).
        critical: span ids on the critical path.
    """

    def __init__(self, spans: pa.Table, critical: set[str] | None = None) -> None:
        self.spans = spans
        n = spans.num_rows
        chip = spans["chip_id"].to_pylist()
        link = spans["link_id"].to_pylist()
        lanes = [c or (f"{lk}" if lk else "(no chip)") for c, lk in zip(chip, link, strict=True)]
        names, lane_idx = np.unique(np.array(lanes, dtype=object), return_inverse=True)
        # Chips first, then links, then spans on neither (roots, host code).
        kind = np.array([0 if not str(x).startswith("(") and ":" in str(x) and
                         str(x).split(":")[0] in _CHIPS else (2 if str(x).startswith("(") else 1)
                         for x in names])  # fmt: skip
        lane_order = np.lexsort((names.astype(str), kind))
        rank = np.empty_like(lane_order)
        rank[lane_order] = np.arange(len(lane_order))
        self.start = spans["start_ns"].to_numpy().astype(np.int64) if n else np.zeros(0, np.int64)
        self.end = spans["end_ns"].to_numpy().astype(np.int64) if n else np.zeros(0, np.int64)
        order = np.lexsort((self.start, rank[lane_idx])) if n else np.zeros(0, np.int64)
        lane_of_sorted = rank[lane_idx][order] if n else np.zeros(0, np.int64)
        first = np.r_[True, lane_of_sorted[1:] != lane_of_sorted[:-1]] if n else np.zeros(0, bool)
        # One header row before each lane's first span.
        self.rows = np.insert(order, np.flatnonzero(first), -1)
        self.header_lane = {int(i + k): str(names[lane_order[lane_of_sorted[i]]])
                            for k, i in enumerate(np.flatnonzero(first))}  # fmt: skip
        self.lane_counts = np.bincount(lane_of_sorted, minlength=len(names)) if n else np.zeros(0)
        self.names = spans["name"].to_pylist()
        ids = spans["span_id"].to_pylist()
        crit = critical or set()
        self.critical = np.array([i in crit for i in ids], dtype=bool)
        self.t0 = int(self.start.min()) if n else 0
        self.t1 = int(self.end.max()) if n else 1

    def __len__(self) -> int:
        return len(self.rows)

    def span_row(self, i: int) -> dict[str, Any]:
        row = self.spans.slice(i, 1).to_pylist()[0]
        row["_critical"] = bool(self.critical[i])
        return row


_CHIPS = ("gpu", "cpu", "dpu", "npu", "nic", "switch")


class Waterfall(ScrollView, can_focus=True):
    """Gantt rows of one trace; up/down select a span, +/- zoom time around it."""

    BINDINGS = [
        Binding("up", "cursor(-1)", "Up", show=False),
        Binding("down", "cursor(1)", "Down", show=False),
        Binding("pageup", "cursor(-20)", "Page up", show=False),
        Binding("pagedown", "cursor(20)", "Page down", show=False),
        Binding("home", "cursor(-1e12)", "First", show=False),
        Binding("end", "cursor(1e12)", "Last", show=False),
        Binding("right_square_bracket", "zoom(0.5)", "Zoom in"),
        Binding("left_square_bracket", "zoom(2)", "Zoom out"),
        Binding("c", "next_critical", "Next critical"),
    ]
    COMPONENT_CLASSES = {
        "waterfall--bar", "waterfall--critical", "waterfall--cursor",
        "waterfall--lane", "waterfall--label", "waterfall--axis",
    }  # fmt: skip

    cursor = reactive(0)

    class SpanSelected(Message):
        """The cursor moved onto a span."""

        def __init__(self, row: dict[str, Any]) -> None:
            self.row = row
            super().__init__()

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.data: WaterfallRows | None = None
        self.view = (0, 1)

    def load(self, data: WaterfallRows) -> None:
        """Show a laid-out trace (built in a worker: laying out is O(n log n))."""
        self.data = data
        self.view = (data.t0, max(data.t1, data.t0 + 1))
        self.virtual_size = Size(self.size.width, len(data))
        self.cursor = 1 if len(data) > 1 else 0
        self.scroll_to(0, 0, animate=False)
        self.refresh()

    def watch_cursor(self, old: int, new: int) -> None:
        if self.data is None or not len(self.data):
            return
        self.scroll_to_region(Region(0, new, 1, 1), animate=False)
        self.refresh()
        i = int(self.data.rows[new])
        if i >= 0:
            self.post_message(self.SpanSelected(self.data.span_row(i)))

    def action_cursor(self, delta: float) -> None:
        if self.data is None or not len(self.data):
            return
        target = int(min(max(self.cursor + delta, 0), len(self.data) - 1))
        step = 1 if delta > 0 else -1
        while 0 <= target < len(self.data) and self.data.rows[target] < 0:  # skip lane headers
            target += step
        if 0 <= target < len(self.data):
            self.cursor = target

    def action_zoom(self, factor: float) -> None:
        """Narrow (factor < 1) or widen the time axis around the selected span."""
        if self.data is None:
            return
        i = int(self.data.rows[self.cursor]) if len(self.data) else -1
        lo, hi = self.view
        mid = (self.data.start[i] + self.data.end[i]) // 2 if i >= 0 else (lo + hi) // 2
        half = max(int((hi - lo) * factor / 2), 500)
        full = self.data.t1 - self.data.t0
        if 2 * half >= full:
            self.view = (self.data.t0, self.data.t1)
        else:
            lo = min(max(mid - half, self.data.t0), self.data.t1 - 2 * half)
            self.view = (lo, lo + 2 * half)
        self.refresh()

    def action_next_critical(self) -> None:
        if self.data is None:
            return
        rows = self.data.rows
        crit = np.flatnonzero((rows >= 0) & self.data.critical[np.maximum(rows, 0)])
        after = crit[crit > self.cursor]
        if len(crit):
            self.cursor = int(after[0] if len(after) else crit[0])

    def render_line(self, y: int) -> Strip:
        scroll_x, scroll_y = self.scroll_offset
        row = y + scroll_y
        width = self.size.width
        if self.data is None or row >= len(self.data):
            return Strip.blank(width, self.rich_style)
        i = int(self.data.rows[row])
        if i < 0:
            return self._lane_line(row, width)
        return self._span_line(row, i, width)

    def _lane_line(self, row: int, width: int) -> Strip:
        lane = self.data.header_lane.get(row, "")
        lo, hi = self.view
        text = f"▾ {lane}"
        axis = f" {human_ns(lo - self.data.t0)} … {human_ns(hi - self.data.t0)} "
        pad = max(width - len(text) - len(axis), 1)
        style = self.get_component_rich_style("waterfall--lane")
        axis_style = self.get_component_rich_style("waterfall--axis")
        return Strip([Segment(text + " " * pad, style), Segment(axis, axis_style)]).crop_extend(0, width, style)

    def _span_line(self, row: int, i: int, width: int) -> Strip:
        d = self.data
        label_w = min(LABEL_MAX, max(10, width // 3))
        bar_w = max(width - label_w - 10, 4)
        crit = bool(d.critical[i])
        mark = "◆" if crit else " "
        label = f"{mark} {d.names[i]}"[:label_w].ljust(label_w)
        dur = f"{human_ns(d.end[i] - d.start[i]):>9} "
        lo, hi = self.view
        scale = bar_w / max(hi - lo, 1)
        a = int((d.start[i] - lo) * scale)
        b = int(np.ceil((d.end[i] - lo) * scale))
        a, b = min(max(a, 0), bar_w), min(max(b, 0), bar_w)
        if b <= a and d.end[i] >= lo and d.start[i] <= hi:
            b = min(a + 1, bar_w)
            a = b - 1
        base = self.rich_style
        bar_style = self.get_component_rich_style("waterfall--critical" if crit else "waterfall--bar")
        label_style = self.get_component_rich_style("waterfall--label")
        if row == self.cursor:
            cursor = self.get_component_rich_style("waterfall--cursor")
            label_style, base = label_style + cursor, base + cursor
        segs = [
            Segment(label, label_style),
            Segment(dur, label_style),
            Segment(" " * a, base),
            Segment("█" * (b - a), bar_style + Style(bgcolor=base.bgcolor)),
            Segment(" " * (bar_w - b), base),
        ]
        return Strip(segs).crop_extend(0, width, base)

    def on_resize(self) -> None:
        if self.data is not None:
            self.virtual_size = Size(self.size.width, len(self.data))
