"""The SQL console: DuckDB SQL against the live store, results in a table, history."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.message import Message
from textual.widgets import DataTable, Input, Static

from chiptrace.errors import ChiptraceError
from chiptrace.query import format_cell
from chiptrace.viewer.queries import LiveStore

MAX_ROWS = 1000  # rows drawn; DataTable is not for millions, and LIMIT is the user's tool
EXAMPLE = "SELECT chip_type, count(*) AS spans FROM spans GROUP BY ALL ORDER BY spans DESC"


class SqlInput(Input):
    """An Input whose up/down walk the query history."""

    BINDINGS = [
        Binding("up", "history(-1)", "Older", show=False),
        Binding("down", "history(1)", "Newer", show=False),
        Binding("escape", "leave", "Keys"),  # the app's letter keys work again
    ]

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.history: list[str] = []
        self.pos = 0

    def remember(self, sql: str) -> None:
        if not self.history or self.history[-1] != sql:
            self.history.append(sql)
        self.pos = len(self.history)

    def action_leave(self) -> None:
        """Hand the keys back to the app (d, e, s, q ...) by focusing the result table."""
        self.screen.query_one("#sql-result").focus()

    def action_history(self, delta: int) -> None:
        if not self.history:
            return
        self.pos = min(max(self.pos + delta, 0), len(self.history))
        self.value = self.history[self.pos] if self.pos < len(self.history) else ""
        self.cursor_position = len(self.value)


class SqlConsole(Vertical):
    """Type SQL, press Enter; errors show in place of the result line."""

    class Result(Message):
        def __init__(self, sql: str, table: pa.Table | None, error: str | None) -> None:
            self.sql, self.table, self.error = sql, table, error
            super().__init__()

    def __init__(self, store: LiveStore | None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.store = store

    def compose(self) -> ComposeResult:
        yield SqlInput(placeholder=EXAMPLE, id="sql-input")
        yield Static(
            "[$text-muted]views: spans, chips, links, runs · macros: utilization(ms), "
            "link_throughput(ms) · ↑↓ history[/]",
            id="sql-status",
        )
        yield DataTable(id="sql-result", zebra_stripes=True)

    @on(Input.Submitted, "#sql-input")
    def _submit(self, event: Input.Submitted) -> None:
        sql = event.value.strip() or EXAMPLE
        box = self.query_one(SqlInput)
        box.remember(sql)
        self.run_query(sql)

    def run_query(self, sql: str) -> None:
        """Run `sql` in a worker; the result or the error lands in place."""
        if self.store is None:
            self._show_error("this source keeps no store: start with --out DIR")
            return
        self.query_one("#sql-status", Static).update("[$text-muted]running…[/]")
        self._run(self.store, sql)

    @work(thread=True, exclusive=True, exit_on_error=False)
    def _run(self, store: LiveStore, sql: str) -> None:
        try:
            table = store.sql(sql)
            self.post_message(self.Result(sql, table, None))
        except ChiptraceError as e:
            self.post_message(self.Result(sql, None, str(e)))

    def on_sql_console_result(self, msg: Result) -> None:
        table = msg.table
        if msg.error is not None or table is None:
            self._show_error(msg.error or "no result")
            return
        grid = self.query_one("#sql-result", DataTable)
        grid.clear(columns=True)
        grid.add_columns(*table.column_names)
        for row in table.slice(0, MAX_ROWS).to_pylist():
            grid.add_row(*(format_cell(v, null="") for v in row.values()))
        more = f" (first {MAX_ROWS:,} shown)" if table.num_rows > MAX_ROWS else ""
        self.remove_class("-error")
        self.query_one("#sql-status", Static).update(f"[$success]{table.num_rows:,} rows{more}[/]")

    def _show_error(self, error: str) -> None:
        from textual.markup import escape

        self.add_class("-error")
        self.query_one("#sql-status", Static).update(f"[b $error]{escape(error)}[/]")
