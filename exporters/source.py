"""Selecting the spans to export from trace directories: DuckDB over `spans_raw`.

Every export format reads through here, so `--trace-id`, `--since`/`--until` and
`--where` mean the same thing for OTLP, Jaeger JSON and Chrome JSON.
"""

from __future__ import annotations

import datetime as dt
import os
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field

import pyarrow as pa

from chiptrace.errors import ConfigError

MEMORY_LIMIT = "512MB"  # DuckDB's, for an export; the process stays under 1 GiB
_HEX = re.compile(r"^[0-9a-fA-F]{1,32}$")


@dataclass(frozen=True)
class SpanFilter:
    """Which spans to export.

    A filter that selects part of a trace (`since_ns`, `until_ns`, `where`) is closed
    by the SpanSource: the ancestors of every selected span come along as context.

    Attributes:
        trace_ids: lowercase hex trace ids (32 digits); empty means all traces.
        since_ns: keep spans starting at or after this Unix time in ns.
        until_ns: keep spans starting before this Unix time in ns.
        where: an SQL condition over `spans_raw` columns (DuckDB dialect).
    """

    trace_ids: Sequence[str] = field(default_factory=tuple)
    since_ns: int | None = None
    until_ns: int | None = None
    where: str | None = None

    @property
    def cuts_trees(self) -> bool:
        """Whether this filter can select part of a trace (whole traces are always closed)."""
        return self.since_ns is not None or self.until_ns is not None or bool(self.where)

    def sql(self, columns: str = "*", order: bool = False) -> str:
        """The SELECT over spans_raw that applies this filter."""
        cond = []
        if self.trace_ids:
            ids = ", ".join(f"from_hex('{t}')" for t in self.trace_ids)
            cond.append(f"trace_id IN ({ids})")
        if self.since_ns is not None:
            cond.append(f"start_ns >= {int(self.since_ns)}")
        if self.until_ns is not None:
            cond.append(f"start_ns < {int(self.until_ns)}")
        if self.where:
            cond.append(f"({self.where})")
        sql = f"SELECT {columns} FROM spans_raw"
        if cond:
            sql += " WHERE " + " AND ".join(cond)
        if order:
            sql += " ORDER BY trace_id, start_ns, span_id"
        return sql


def parse_trace_id(raw: str) -> str:
    """A trace id as 32 lowercase hex digits (shorter ids are zero-padded, as Jaeger does).

    Raises:
        ConfigError: not hexadecimal, or longer than 32 digits.
    """
    text = raw.strip().lower()
    if not _HEX.match(text):
        raise ConfigError(f"--trace-id {raw!r}: expected up to 32 hex digits")
    return text.rjust(32, "0")


def parse_time(name: str, raw: str) -> int:
    """A point in time as Unix ns: an integer (ns), or ISO 8601 (UTC unless it says).

    Raises:
        ConfigError: neither form.
    """
    text = raw.strip()
    if re.fullmatch(r"-?\d+", text):
        return int(text)
    try:
        when = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ConfigError(
            f"{name} {raw!r}: expected Unix ns or ISO 8601 like 2026-11-30T21:00:00Z"
        ) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    delta = when - dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
    return (delta.days * 86_400 + delta.seconds) * 1_000_000_000 + delta.microseconds * 1000


class SpanSource:
    """The filtered spans of one or more trace dirs.

    Args:
        dirs: trace directories (globs allowed), as `chiptrace.connect` takes them.
        span_filter: which spans; all when omitted.

    Raises:
        StoreError: no trace parts. QueryError: the --where condition is not valid SQL.
    """

    def __init__(
        self,
        dirs: str | os.PathLike[str] | Iterable[str | os.PathLike[str]],
        span_filter: SpanFilter | None = None,
    ) -> None:
        from chiptrace.query import connect, run_sql

        self.filter = span_filter or SpanFilter()
        # An export reads every span anyway: one extra scan finds parts with a data page
        # that does not decode, so they are skipped (named in a warning), not a crash.
        # A memory limit: the sorts and joins of an export of any size spill to disk
        # instead of growing with the run (the Chrome export of 11M spans took 8.8 GB).
        self.con = connect(dirs, verify=True, memory_limit=MEMORY_LIMIT)
        self._run_sql = run_sql
        self._selection = self.filter.sql()
        self.context = 0  # ancestors added to close the selected trees
        if self.filter.cuts_trees:
            self._close_trees()
        self.count = int(
            run_sql(self.con, f"SELECT count(*) FROM ({self._selection})").column(0)[0].as_py()
        )

    def _close_trees(self) -> None:
        """Make the selection a set of whole subtrees: every ancestor of a selected span
        joins it (as context), and a parent the store does not hold is dropped (the span
        becomes a root), so no exported span refers to a span the file lacks."""
        base = self.filter.sql("trace_id, span_id, parent_span_id")
        self._run_sql(
            self.con,
            f"""
            CREATE OR REPLACE TEMP TABLE chiptrace_keep AS
            WITH RECURSIVE base AS ({base}),
            up(trace_id, span_id) AS (
                SELECT trace_id, parent_span_id FROM base WHERE parent_span_id IS NOT NULL
                UNION
                SELECT p.trace_id, p.parent_span_id
                FROM up u JOIN spans_raw p ON p.trace_id = u.trace_id AND p.span_id = u.span_id
                WHERE p.parent_span_id IS NOT NULL
            )
            SELECT DISTINCT s.trace_id, s.span_id, b.span_id IS NULL AS context
            FROM spans_raw s
            JOIN (SELECT trace_id, span_id FROM base UNION SELECT trace_id, span_id FROM up) k
              ON k.trace_id = s.trace_id AND k.span_id = s.span_id
            LEFT JOIN (SELECT DISTINCT trace_id, span_id FROM base) b
              ON b.trace_id = s.trace_id AND b.span_id = s.span_id
            """,
        )
        self.context = int(
            self._run_sql(self.con, "SELECT count(*) FROM chiptrace_keep WHERE context")
            .column(0)[0]
            .as_py()
        )
        self._selection = """
            SELECT s.* REPLACE (
                CASE WHEN p.span_id IS NULL THEN NULL ELSE s.parent_span_id END AS parent_span_id)
            FROM spans_raw s
            JOIN chiptrace_keep k ON k.trace_id = s.trace_id AND k.span_id = s.span_id
            LEFT JOIN chiptrace_keep p
              ON p.trace_id = s.trace_id AND p.span_id = s.parent_span_id"""

    @classmethod
    def of_table(cls, table: pa.Table) -> SpanSource:
        """All spans of an in-memory table (spans_raw columns), for the Python API."""
        import duckdb

        self = cls.__new__(cls)
        self.filter = SpanFilter()
        self.con = duckdb.connect()
        self.con.register("spans_raw", table)
        self.count = table.num_rows
        self.context = 0
        self._selection = self.filter.sql()
        from chiptrace.query import run_sql

        self._run_sql = run_sql
        return self

    def batches(self, batch_size: int = 65_536) -> Iterator[pa.RecordBatch]:
        """Stream the spans in record batches (store order; no sort, so no memory spike)."""
        return self.stream("SELECT * FROM selected", batch_size)

    def stream(self, sql: str, batch_size: int = 65_536) -> Iterator[pa.RecordBatch]:
        """Stream any query on this source's connection in record batches; the filtered
        spans are the view `selected` while it runs."""
        from chiptrace.errors import QueryError

        try:
            self.con.execute(f"CREATE OR REPLACE TEMP VIEW selected AS {self._selection}")
            reader = self.con.sql(sql).to_arrow_reader(batch_size)
        except Exception as e:  # duckdb.Error; the count above already validated the filter
            raise QueryError(f"SQL error: {str(e).splitlines()[0]}") from e
        yield from reader

    def run(self, sql: str) -> None:
        """Run a statement on this source's connection, with the filtered spans as the
        view `selected` (a temp table built from them, say).

        Raises:
            QueryError: DuckDB rejected it.
        """
        self.con.execute(f"CREATE OR REPLACE TEMP VIEW selected AS {self._selection}")
        self._run_sql(self.con, sql)

    def table(self) -> pa.Table:
        """All selected spans in one table, sorted by trace, then start time."""
        return self._run_sql(
            self.con, f"SELECT * FROM ({self._selection}) ORDER BY trace_id, start_ns, span_id"
        )
