"""The list of traces (steps) in the store, newest first."""

from __future__ import annotations

import pyarrow as pa
from textual.widgets import DataTable

from chiptrace.viewer.render import human_ns


class TraceList(DataTable):
    """One row per trace: root span, span count, duration. Enter opens the waterfall."""

    def on_mount(self) -> None:
        self.cursor_type = "row"
        self.add_columns("trace", "root", "spans", "duration")
        self.border_title = "TRACES"

    def show(self, table: pa.Table) -> None:
        """Replace the rows; keeps the cursor on the same trace when it is still listed."""
        keep = None
        if self.row_count:
            try:
                keep = self.coordinate_to_cell_key(self.cursor_coordinate).row_key.value
            except Exception:  # noqa: BLE001 - no valid cursor yet
                keep = None
        self.clear()
        for r in table.to_pylist():
            self.add_row(
                r["trace_id"][:12],
                r["root"] or "-",
                f"{r['spans']:,}",
                human_ns(r["duration_ns"] or 0),
                key=r["trace_id"],
            )
        if keep is not None and keep in self.rows:
            self.move_cursor(row=self.get_row_index(keep))
