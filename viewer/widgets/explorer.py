"""The trace explorer: the store's traces, a waterfall of the chosen one, its span details.

DuckDB queries and the row layout run in thread workers that post messages back, so the
UI never waits on the store.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
from textual import on, work
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.markup import escape
from textual.message import Message
from textual.widgets import DataTable, Static

from chiptrace.errors import ChiptraceError
from chiptrace.viewer.queries import LiveStore, critical_span_ids
from chiptrace.viewer.widgets.span_detail import SpanDetail
from chiptrace.viewer.widgets.trace_list import TraceList
from chiptrace.viewer.widgets.waterfall import Waterfall, WaterfallRows


class Explorer(Vertical):
    """Traces on top; the waterfall and the selected span's attributes below."""

    class TracesLoaded(Message):
        def __init__(self, table: pa.Table) -> None:
            self.table = table
            super().__init__()

    class TraceLoaded(Message):
        def __init__(self, trace_id: str, rows: WaterfallRows, error: str | None) -> None:
            self.trace_id = trace_id
            self.rows = rows
            self.error = error  # why the critical path is missing, if it is
            super().__init__()

    class Failed(Message):
        def __init__(self, error: str) -> None:
            self.error = error
            super().__init__()

    def __init__(self, store: LiveStore | None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.store = store
        self.trace_id: str | None = None

    def compose(self) -> ComposeResult:
        yield TraceList(id="trace-list")
        yield Static("", id="explorer-status")
        with Horizontal(id="explorer-body"):
            yield Waterfall(id="waterfall")
            yield SpanDetail(id="span-detail")

    def reload(self) -> None:
        """Refresh the trace list from the store (in a worker)."""
        if self.store is None:
            self._status("[$text-muted]this source keeps no store: start with --out DIR[/]")
            return
        self._load_traces(self.store)

    def open_trace(self, trace_id: str) -> None:
        """Lay out one trace's waterfall (in a worker)."""
        if self.store is None:
            return
        self.trace_id = trace_id
        self._status(f"loading trace {trace_id[:12]}…")
        self._load_trace(self.store, trace_id)

    def _status(self, text: str) -> None:
        self.query_one("#explorer-status", Static).update(text)

    @work(thread=True, exclusive=True, exit_on_error=False, group="traces")
    def _load_traces(self, store: LiveStore) -> None:
        try:
            self.post_message(self.TracesLoaded(store.traces()))
        except ChiptraceError as e:
            self.post_message(self.Failed(str(e)))

    @work(thread=True, exclusive=True, exit_on_error=False, group="trace")
    def _load_trace(self, store: LiveStore, trace_id: str) -> None:
        try:
            spans = store.trace_spans(trace_id)
            critical, error = critical_span_ids(spans)
            rows = WaterfallRows(spans, critical)
            self.post_message(self.TraceLoaded(trace_id, rows, error))
        except ChiptraceError as e:
            self.post_message(self.Failed(str(e)))

    def on_explorer_traces_loaded(self, msg: TracesLoaded) -> None:
        self.query_one(TraceList).show(msg.table)
        if msg.table.num_rows and self.trace_id is None:
            self.open_trace(msg.table["trace_id"][0].as_py())
        elif not msg.table.num_rows:
            self._status("[$text-muted]no traces stored yet[/]")

    def on_explorer_trace_loaded(self, msg: TraceLoaded) -> None:
        n = int((msg.rows.rows >= 0).sum())
        crit = int(msg.rows.critical.sum())
        path = (
            f"[$error]critical path failed: {escape(msg.error)}[/]"
            if msg.error
            else f"[$error]◆[/] {crit} on the critical path"
        )
        self._status(
            f"trace [b]{msg.trace_id[:16]}[/]  {n:,} spans  {path}  "
            "[$text-muted]\\[ ] zoom · c next ◆[/]"
        )
        self.query_one(Waterfall).load(msg.rows)

    def on_explorer_failed(self, msg: Failed) -> None:
        self._status(f"[$error]{msg.error}[/]")

    @on(DataTable.RowSelected, "#trace-list")
    def _trace_chosen(self, event: DataTable.RowSelected) -> None:
        self.open_trace(str(event.row_key.value))
        self.query_one(Waterfall).focus()

    def on_waterfall_span_selected(self, msg: Waterfall.SpanSelected) -> None:
        self.query_one(SpanDetail).show(msg.row)
