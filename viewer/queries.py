"""DuckDB over the live store for the explorer and the SQL console (no drawing here).

One connection per viewer, guarded by a lock (DuckDB connections are not for concurrent
use from several threads); its views are re-pointed at the parts on disk whenever new parts
have landed, so every query sees the store as it is now. Callers run these from thread
workers: a query over millions of spans takes a while.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa

from chiptrace import query
from chiptrace.errors import StoreError
from chiptrace.store import part_files, part_problem, warn_skipped

log = logging.getLogger("chiptrace")

TRACE_LIST_SQL = """
SELECT lower(hex(trace_id)) AS trace_id,
       arg_min(name, start_ns) FILTER (WHERE parent_span_id IS NULL) AS root,
       count(*) AS spans, min(start_ns) AS start_ns, max(end_ns) - min(start_ns) AS duration_ns
FROM spans_raw GROUP BY trace_id ORDER BY min(start_ns) DESC LIMIT {limit}
"""

TRACE_SPANS_SQL = """
SELECT span_id, parent_span_id, trace_id, name, start_ns, end_ns, duration_ns, chip_id, chip_type,
       link_id, link_type, link_src, link_dst, op_kind, op_bytes, op_flops, op_precision,
       status_code, status_message, service, host, pid, attributes, events, links
FROM spans WHERE trace_id = '{trace_id}' ORDER BY start_ns
"""


class LiveStore:
    """A DuckDB connection over a trace dir that keeps up with new parts.

    Args:
        directory: the trace dir (may be empty at first).
    """

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)
        self._lock = threading.Lock()
        self._parts: list[Path] | None = None
        self._con: duckdb.DuckDBPyConnection | None = None
        self._usable: dict[Path, bool] = {}  # parts never change: each is checked once
        self._closed = False

    def _good(self, parts: list[Path]) -> list[Path]:
        for p in parts:
            if p not in self._usable:
                reason = part_problem(p)
                self._usable[p] = reason is None
                if reason:
                    warn_skipped(p, reason)
        return [p for p in parts if self._usable[p]]

    def _connection(self) -> duckdb.DuckDBPyConnection:
        if self._closed:  # a worker that started as the viewer quit: no new connection
            raise StoreError(f"{self.directory}: the viewer is closing")
        if self._con is None:
            if not self.directory.is_dir():
                raise StoreError(f"trace dir {str(self.directory)!r} does not exist yet")
            self._con = query.connect(self.directory, allow_empty=True)
            self._parts = self._good(part_files(self.directory))
        parts = self._good(part_files(self.directory))
        if parts != self._parts:  # new parts landed: one CREATE VIEW, no data read
            query.attach_views(self._con, parts)
            self._parts = parts
        return self._con

    def sql(self, text: str) -> pa.Table:
        """Run SQL against the store as it is now.

        Raises:
            QueryError: DuckDB rejected the SQL.
            StoreError: the directory does not exist.
        """
        with self._lock:
            return query.run_sql(self._connection(), text)

    def traces(self, limit: int = 500) -> pa.Table:
        """The newest traces (steps): id, root span name, span count, start, duration."""
        return self.sql(TRACE_LIST_SQL.format(limit=int(limit)))

    def trace_spans(self, trace_id: str) -> pa.Table:
        """Every span of one trace, by start time."""
        if not all(c in "0123456789abcdef" for c in trace_id):
            raise StoreError(f"trace id {trace_id!r}: expected lowercase hex")
        return self.sql(TRACE_SPANS_SQL.format(trace_id=trace_id))

    def findings(self, since_ns: int, until_ns: int) -> list[Any]:
        """The analysis rules over [since_ns, until_ns) (`chiptrace.analysis.analyze`)."""
        from chiptrace.analysis import analyze

        with self._lock:
            return analyze(self._connection(), since_ns, until_ns, sample_steps=1)

    def close(self) -> None:
        """Close the connection, stopping the queries of a caller that holds it: the
        analysis rules over a 100M-span store run ~10 s, one query per rule, and the
        process cannot exit before their thread returns. Later calls raise StoreError."""
        self._closed = True
        while not self._lock.acquire(timeout=0.05):
            con = self._con
            if con is not None:
                con.interrupt()  # raises in the running query; the next one is stopped too
        try:
            if self._con is not None:
                self._con.close()
                self._con = None
        finally:
            self._lock.release()


def critical_span_ids(spans: pa.Table) -> tuple[set[str], str | None]:
    """Span ids on the trace's critical path, as the report finds it
    (`chiptrace.analysis.critical_path`), and the error when that failed: the waterfall
    then shows no path and says why, rather than a path from a different algorithm."""
    if not spans.num_rows:
        return set(), None
    # Imported here: the analysis package takes ~0.5 s to import and the dashboard
    # starts without it.
    from chiptrace.analysis.critical_path import critical_path

    try:
        path = critical_path(spans.to_pylist())
    except Exception as e:  # noqa: BLE001 - a bug or odd input there must not blank the waterfall
        log.warning("chiptrace: critical path of the trace failed: %s", e, exc_info=True)
        return set(), f"{type(e).__name__}: {e}"
    return {seg.span_id for seg in path.segments if seg.span_id}, None


def span_details(row: dict[str, Any]) -> list[tuple[str, str]]:
    """(key, value) pairs of one span for the detail pane: columns, then attributes."""
    import json

    out = []
    for k, v in row.items():
        if v is None or k in ("attributes", "events", "links", "_critical"):
            continue
        out.append((k, str(v)))
    for k in ("attributes", "events", "links"):
        raw = row.get(k)
        if not raw or raw in ("{}", "[]"):
            continue
        try:
            parsed = json.loads(raw)
        except ValueError:
            out.append((k, str(raw)))
            continue
        if isinstance(parsed, dict):
            out.extend((a if k == "attributes" else f"{k}.{a}", str(v)) for a, v in parsed.items())
        else:
            out.append((k, json.dumps(parsed)[:400]))
    return out
