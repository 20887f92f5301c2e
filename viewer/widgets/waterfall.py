"""The waterfall: one trace's spans as Gantt bars, grouped in rows by chip and link.

Rows are laid out once per trace with NumPy (a lane header, then that lane's spans by
start time) and drawn lazily with Textual's Line API: `render_line` builds only the rows
on screen, so a 100,000-span trace costs the same to scroll as a 100-span one.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from rich.segment import Segment
from rich.style import Style
from textual.binding import Binding
from textual.geometry import Region, Size
from textual.message import Message
from textual.reactive import reactive
from textual.scroll_view import ScrollView
from textual.strip import Strip

from chiptrace.schema import chip_type_of
from chiptrace.viewer.render import human_ns

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
        # Lane per span with Arrow kernels, not a Python loop: chip, else link, else neither.
        lane_col = pc.coalesce(
            *(pc.cast(spans[c], pa.string()) for c in ("chip_id", "link_id")),
            pa.scalar("(no chip)"),
        )
        enc = (
            lane_col.combine_chunks() if isinstance(lane_col, pa.ChunkedArray) else lane_col
        ).dictionary_encode()
        names = np.array(enc.dictionary.to_pylist(), dtype=object)
        lane_idx = enc.indices.to_numpy(zero_copy_only=False).astype(np.int64)
        # Chips first, then links, then spans on neither (roots, host code).
        kind = np.array(
            [0 if chip_type_of(x) else (2 if str(x).startswith("(") else 1) for x in names]
        )
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
        self.header_lane = {
            int(i + k): str(names[lane_order[lane_of_sorted[i]]])
            for k, i in enumerate(np.flatnonzero(first))
        }
        self.lane_counts = np.bincount(lane_of_sorted, minlength=len(names)) if n else np.zeros(0)
        self.names = spans["name"]  # read per visible row, not converted up front
        crit = pa.array(sorted(critical or ()), pa.string())
        self.critical = (
            pc.is_in(pc.cast(spans["span_id"], pa.string()), value_set=crit)
            .to_numpy(zero_copy_only=False)
            .astype(bool)
        )
        self.t0 = int(self.start.min()) if n else 0
        self.t1 = int(self.end.max()) if n else 1
        # Lane (Gantt) mode: each lane's spans in start order, and where each span sits.
        heads = np.flatnonzero(self.rows < 0)
        bounds = np.r_[heads, len(self.rows)]
        self.lane_names = [self.header_lane[int(h)] for h in heads]
        self.lane_spans = [self.rows[bounds[k] + 1 : bounds[k + 1]] for k in range(len(heads))]
        self.lane_of = np.zeros(n, dtype=np.int64)
        self.row_of = np.zeros(n, dtype=np.int64)
        for k, idx in enumerate(self.lane_spans):
            self.lane_of[idx] = k
            self.row_of[idx] = np.arange(bounds[k] + 1, bounds[k + 1])
        self.critical_order = np.flatnonzero(self.critical)[
            np.argsort(self.start[self.critical], kind="stable")
        ]

    def __len__(self) -> int:
        return len(self.rows)

    def span_row(self, i: int) -> dict[str, Any]:
        row = self.spans.slice(i, 1).to_pylist()[0]
        row["_critical"] = bool(self.critical[i])
        return row


class Waterfall(ScrollView, can_focus=True):
    """One trace as Gantt rows: a row per chip and link (lanes), or a row per span (g).

    Up/down move between rows, left/right between the spans of a lane, [ and ] zoom time
    around the selected span, c jumps to the next span on the critical path.
    """

    BINDINGS = [
        Binding("up", "cursor(-1)", "Up", show=False),
        Binding("down", "cursor(1)", "Down", show=False),
        Binding("left", "step(-1)", "Prev span", show=False),
        Binding("right", "step(1)", "Next span", show=False),
        Binding("pageup", "cursor(-20)", "Page up", show=False),
        Binding("pagedown", "cursor(20)", "Page down", show=False),
        Binding("home", "cursor(-1e12)", "First", show=False),
        Binding("end", "cursor(1e12)", "Last", show=False),
        Binding("right_square_bracket", "zoom(0.5)", "Zoom in"),
        Binding("left_square_bracket", "zoom(2)", "Zoom out"),
        Binding("c", "next_critical", "Critical"),
        Binding("g", "toggle_lanes", "Lanes/spans"),
    ]
    COMPONENT_CLASSES = {
        "waterfall--bar",
        "waterfall--critical",
        "waterfall--cursor",
        "waterfall--lane",
        "waterfall--label",
        "waterfall--axis",
    }

    lanes = reactive(True)

    class SpanSelected(Message):
        """The selection moved onto a span."""

        def __init__(self, row: dict[str, Any]) -> None:
            self.row = row
            super().__init__()

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.data: WaterfallRows | None = None
        self.view = (0, 1)
        self.cursor = 0  # row on screen: a lane (lane mode) or a row of data.rows
        self.selected = -1  # span index

    # ------------------------------------------------------------ state

    def load(self, data: WaterfallRows) -> None:
        """Show a laid-out trace (built in a worker: laying out is O(n log n))."""
        self.data = data
        self.view = (data.t0, max(data.t1, data.t0 + 1))
        self._resize_virtual()
        self.scroll_to(0, 0, animate=False)
        first = (
            data.critical_order[0]
            if len(data.critical_order)
            else (data.rows[1] if len(data) > 1 else -1)
        )
        self._select(int(first))

    def _n_rows(self) -> int:
        if self.data is None:
            return 0
        return len(self.data.lane_names) if self.lanes else len(self.data)

    def _resize_virtual(self) -> None:
        self.virtual_size = Size(self.size.width, self._n_rows())

    def _select(self, i: int) -> None:
        """Select span i: move the cursor to its row, keep it in view, show its details."""
        d = self.data
        if d is None or i < 0:
            return
        self.selected = i
        self.cursor = int(d.lane_of[i] if self.lanes else d.row_of[i])
        lo, hi = self.view
        if d.end[i] < lo or d.start[i] > hi:  # pan the time axis to it, same zoom
            half = (hi - lo) // 2
            mid = (d.start[i] + d.end[i]) // 2
            lo = min(max(mid - half, d.t0), max(d.t1 - 2 * half, d.t0))
            self.view = (lo, lo + 2 * half)
        # After a lanes/spans switch the virtual size changes first: scroll once it has.
        self.call_after_refresh(self.scroll_to_region, Region(0, self.cursor, 1, 1), animate=False)
        self.refresh()
        self.post_message(self.SpanSelected(d.span_row(i)))

    def watch_lanes(self) -> None:
        if self.data is not None:
            self._resize_virtual()
            self._select(self.selected)

    # ------------------------------------------------------------ actions

    def action_toggle_lanes(self) -> None:
        self.lanes = not self.lanes

    def action_cursor(self, delta: float) -> None:
        d = self.data
        if d is None or not self._n_rows():
            return
        target = int(min(max(self.cursor + delta, 0), self._n_rows() - 1))
        if self.lanes:  # the span of the new lane nearest in time to the selected one
            spans = d.lane_spans[target]
            t = d.start[self.selected] if self.selected >= 0 else d.t0
            k = min(int(np.searchsorted(d.start[spans], t)), len(spans) - 1)
            self._select(int(spans[k]))
            return
        step = 1 if delta > 0 else -1
        while 0 <= target < len(d) and d.rows[target] < 0:  # skip lane headers
            target += step
        if 0 <= target < len(d):
            self._select(int(d.rows[target]))

    def action_step(self, delta: int) -> None:
        """The previous or next span in the selected span's lane."""
        d = self.data
        if d is None or self.selected < 0:
            return
        if not self.lanes:
            self.action_cursor(delta)
            return
        spans = d.lane_spans[int(d.lane_of[self.selected])]
        k = int(np.flatnonzero(spans == self.selected)[0]) + delta
        if 0 <= k < len(spans):
            self._select(int(spans[k]))

    def action_zoom(self, factor: float) -> None:
        """Narrow (factor < 1) or widen the time axis around the selected span."""
        d = self.data
        if d is None:
            return
        lo, hi = self.view
        i = self.selected
        mid = (d.start[i] + d.end[i]) // 2 if i >= 0 else (lo + hi) // 2
        half = max(int((hi - lo) * factor / 2), 500)
        if 2 * half >= d.t1 - d.t0:
            self.view = (d.t0, d.t1)
        else:
            lo = min(max(mid - half, d.t0), d.t1 - 2 * half)
            self.view = (lo, lo + 2 * half)
        self.refresh()

    def action_next_critical(self) -> None:
        d = self.data
        if d is None or not len(d.critical_order):
            return
        order = d.critical_order
        pos = np.flatnonzero(order == self.selected)
        k = (int(pos[0]) + 1) % len(order) if len(pos) else 0
        self._select(int(order[k]))

    # ------------------------------------------------------------ drawing

    def render_line(self, y: int) -> Strip:
        _, scroll_y = self.scroll_offset
        row = y + scroll_y
        width = self.size.width
        if self.data is None or row >= self._n_rows():
            return Strip.blank(width, self.rich_style)
        d = self.data
        if self.lanes:
            return self._gantt_line(d, row, width)
        i = int(d.rows[row])
        return self._header_line(d, row, width) if i < 0 else self._span_line(d, row, i, width)

    def _columns(
        self, d: WaterfallRows, idx: np.ndarray, bar_w: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """Bar columns [a, b) of spans idx on the current time axis (at least one cell)."""
        lo, hi = self.view
        scale = bar_w / max(hi - lo, 1)
        a = np.clip(((d.start[idx] - lo) * scale).astype(np.int64), 0, bar_w - 1)
        b = np.clip(np.ceil((d.end[idx] - lo) * scale).astype(np.int64), 0, bar_w)
        return a, np.maximum(b, a + 1)

    def _gantt_line(self, d: WaterfallRows, lane: int, width: int) -> Strip:
        label_w = min(LABEL_MAX, max(10, width // 4))
        bar_w = max(width - label_w - 1, 4)
        spans = d.lane_spans[lane]
        lo, hi = self.view
        spans = spans[(d.start[spans] <= hi) & (d.end[spans] >= lo)]
        state = np.zeros(bar_w + 1, dtype=np.int8)  # 0 idle, 1 busy, 2 critical, 3 selected
        for level, idx in (
            (1, spans),
            (2, spans[d.critical[spans]]),
            (3, spans[spans == self.selected]),
        ):
            if len(idx):
                a, b = self._columns(d, idx, bar_w)
                diff = np.zeros(bar_w + 1, dtype=np.int64)
                np.add.at(diff, a, 1)
                np.add.at(diff, b, -1)
                state[np.cumsum(diff) > 0] = level
        base = self.rich_style
        styles = {
            0: base,
            1: self.get_component_rich_style("waterfall--bar") + Style(bgcolor=base.bgcolor),
            2: self.get_component_rich_style("waterfall--critical") + Style(bgcolor=base.bgcolor),
            3: self.get_component_rich_style("waterfall--cursor"),
        }
        label_style = self.get_component_rich_style("waterfall--lane")
        if lane == self.cursor:
            label_style += self.get_component_rich_style("waterfall--cursor")
        name = d.lane_names[lane]
        name = name if len(name) <= label_w else name[: label_w - 1] + "…"
        segs = [Segment(f"{name:<{label_w}} ", label_style)]
        state = state[:bar_w]
        cuts = np.flatnonzero(np.diff(state)) + 1
        for run in np.split(np.arange(bar_w), cuts):
            if len(run):
                level = int(state[run[0]])
                segs.append(Segment(("·" if level == 0 else "█") * len(run), styles[level]))
        return Strip(segs).crop_extend(0, width, base)

    def _header_line(self, d: WaterfallRows, row: int, width: int) -> Strip:
        lane = d.header_lane.get(row, "")
        lo, hi = self.view
        text = f"▾ {lane}"
        axis = f" {human_ns(lo - d.t0)} … {human_ns(hi - d.t0)} "
        pad = max(width - len(text) - len(axis), 1)
        style = self.get_component_rich_style("waterfall--lane")
        axis_style = self.get_component_rich_style("waterfall--axis")
        return Strip([Segment(text + " " * pad, style), Segment(axis, axis_style)]).crop_extend(
            0, width, style
        )

    def _span_line(self, d: WaterfallRows, row: int, i: int, width: int) -> Strip:
        label_w = min(LABEL_MAX, max(10, width // 3))
        bar_w = max(width - label_w - 10, 4)
        crit = bool(d.critical[i])
        label = f"{'◆' if crit else ' '} {d.names[i].as_py()}"[:label_w].ljust(label_w)
        dur = f"{human_ns(d.end[i] - d.start[i]):>9} "
        lo, hi = self.view
        (a,), (b,) = self._columns(d, np.array([i]), bar_w)
        if d.end[i] < lo or d.start[i] > hi:
            a = b = 0
        base = self.rich_style
        bar_style = self.get_component_rich_style(
            "waterfall--critical" if crit else "waterfall--bar"
        )
        label_style = self.get_component_rich_style("waterfall--label")
        if i == self.selected:
            cursor = self.get_component_rich_style("waterfall--cursor")
            label_style, base = label_style + cursor, base + cursor
        segs = [
            Segment(label, label_style),
            Segment(dur, label_style),
            Segment(" " * int(a), base),
            Segment("█" * int(b - a), bar_style + Style(bgcolor=base.bgcolor)),
            Segment(" " * int(bar_w - b), base),
        ]
        return Strip(segs).crop_extend(0, width, base)

    def on_resize(self) -> None:
        if self.data is not None:
            self._resize_virtual()
