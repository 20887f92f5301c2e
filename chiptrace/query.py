"""SQL over trace directories: DuckDB views on the Parquet parts and the manifests.

`connect(DIR)` gives a DuckDB connection with these views (docs/sql.md has a cookbook):

- `spans`: one row per span; ids as lowercase hex text, times in ns, chip/link columns,
  attributes/events/links as JSON text. `spans_raw` keeps ids as BLOBs (faster joins).
- `chips`: one row per chip seen, with span counts and summed span time.
- `links`: one row per link seen, with transfers and bytes moved.
- `runs`: one row per writer (process) from the manifests: run id, service, host,
  pid, spans written and dropped, and the full manifest as JSON.
- `metrics`: host samples (chiptrace.host) in long format: ts_ns, host, chip_id,
  chip_type, device, metric, value, unit, source ('real'), run_id, pid, sample_time.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.compute as pc

from chiptrace import _macros
from chiptrace.errors import QueryError, SchemaVersionError, StoreError
from chiptrace.schema import COLUMNS, METRIC_COLUMNS, METRICS_SCHEMA, METRICS_TABLE, SPAN_SCHEMA
from chiptrace.store import (
    expand_dirs,
    good_parts,
    part_files,
    read_manifests,
    remove_stale_temps,
    warn_skipped,
)

log = logging.getLogger("chiptrace")

_HEX_IDS = ("trace_id", "span_id", "parent_span_id")

SPANS_VIEW = """
CREATE OR REPLACE VIEW spans AS
SELECT lower(hex(trace_id)) AS trace_id,
       lower(hex(span_id)) AS span_id,
       lower(hex(parent_span_id)) AS parent_span_id,
       {rest},
       end_ns - start_ns AS duration_ns,
       make_timestamp(start_ns // 1000) AS start_time
FROM spans_raw
"""

CHIPS_VIEW = """
CREATE OR REPLACE VIEW chips AS
SELECT chip_id, any_value(chip_type) AS chip_type, any_value(host) AS host,
       count(*) AS spans, sum(end_ns - start_ns) AS span_ns,
       min(start_ns) AS first_ns, max(end_ns) AS last_ns
FROM spans_raw WHERE chip_id IS NOT NULL GROUP BY chip_id
"""

LINKS_VIEW = """
CREATE OR REPLACE VIEW links AS
SELECT link_id, any_value(link_type) AS link_type, link_src, link_dst,
       count(*) AS transfers, sum(op_bytes) AS bytes, sum(end_ns - start_ns) AS span_ns
FROM spans_raw WHERE link_id IS NOT NULL GROUP BY link_id, link_src, link_dst
"""

_RUN_FIELDS = ("run_id", "service", "source", "host", "writer_id", "trace_dir")
_RUN_INTS = ("pid", "started_unix_ns", "spans_written", "spans_dropped", "parts_written")


def _runs_table(manifests: list[dict[str, Any]]) -> pa.Table:
    cols: dict[str, list[Any]] = {f: [] for f in (*_RUN_FIELDS, *_RUN_INTS, "manifest")}
    for m in manifests:
        for f in _RUN_FIELDS:
            cols[f].append(None if m.get(f) is None else str(m.get(f)))
        for f in _RUN_INTS:
            v = m.get(f)
            cols[f].append(int(v) if isinstance(v, (int, float)) else None)
        cols["manifest"].append(json.dumps(m, default=str))
    types = {**{f: pa.string() for f in _RUN_FIELDS}, **{f: pa.int64() for f in _RUN_INTS}}
    types["manifest"] = pa.string()
    return pa.table({k: pa.array(v, types[k]) for k, v in cols.items()})


def connect(
    paths: str | os.PathLike[str] | Iterable[str | os.PathLike[str]],
    *,
    allow_empty: bool = False,
    threads: int | None = None,
    verify: bool = False,
    memory_limit: str | None = None,
    macros: bool = True,
) -> duckdb.DuckDBPyConnection:
    """Open DuckDB over one or more trace directories (globs allowed) as one dataset.

    Parts whose footer does not read, or whose columns do not fit the span schema (a
    foreign Parquet file, a column of the wrong type), are skipped with a warning naming
    the file; the rest stay queryable. Temporary files a killed writer left are removed.

    Args:
        paths: trace dir(s), glob(s) or part file(s).
        allow_empty: give empty views instead of an error when there are no parts yet
            (a live viewer waiting for the first flush).
        threads: DuckDB worker threads (default: DuckDB's choice).
        verify: also decode every data page once and skip parts that fail (a corrupt
            page passes the footer check). Costs a scan of the whole trace, about 0.2 s
            per million spans: for commands that read everything anyway (export, report).
        memory_limit: DuckDB's memory limit (`'2GB'`); past it, sorts, joins and
            aggregates spill to a temporary directory. Default: DuckDB's (80% of RAM).
        macros: create the analysis macros (`utilization(...)`, ...): half of a
            connection's cost over a rank's parts; a report's stages (which read
            `spans_raw` only) go without.

    Raises:
        StoreError: a missing dir, or no parts at all (unless allow_empty).
        SchemaVersionError: a part from a newer chiptrace.
    """
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    dirs = expand_dirs(paths)
    for d in dirs:
        remove_stale_temps(d)
    good, bad = good_parts(dirs)
    # A run with host samples but no spans yet (`chiptrace record -- sleep 5`) is a trace.
    if (
        not good
        and not allow_empty
        and not any(part_files(d, "metrics") for d in dirs if d.is_dir())
    ):
        _refuse(dirs, bad)
    for path, reason in bad:
        warn_skipped(path, reason)
    con = duckdb.connect(config=_config(threads, memory_limit))
    if verify:
        good = readable_parts(con, good)
    attach_views(con, good)
    # Parquet footers cached: the report reads a store in many passes, and re-reading 275
    # footers per query costs more than the rows of a small store.
    con.execute("SET parquet_metadata_cache = true")
    con.register("_runs_arrow", _runs_table(read_manifests(dirs)))
    con.execute("CREATE OR REPLACE VIEW runs AS SELECT * FROM _runs_arrow")
    attach_metrics(con, dirs)
    if macros:
        _macros.install(con)  # analysis macros: utilization(window_ms), link_throughput(...), ...
    return con


def _refuse(dirs: list[Path], bad: list[tuple[Path, str]]) -> None:
    """No part to read: one line saying why (the first bad part's reason, if any)."""
    names = ", ".join(str(d) for d in dirs)
    if not bad:
        raise StoreError(f"no trace parts in {names} (expected spans/*.parquet)")
    path, reason = bad[0]
    more = f" (and {len(bad) - 1} more bad parts)" if len(bad) > 1 else ""
    error = SchemaVersionError if "newer than this chiptrace" in reason else StoreError
    raise error(f"no readable trace parts in {names}: {path}: {reason}{more}")


def _config(threads: int | None, memory_limit: str | None) -> dict[str, Any]:
    """DuckDB settings: spills go under the system's temp dir, not `.tmp` in the caller's
    working directory."""
    config: dict[str, Any] = {
        "temp_directory": os.path.join(tempfile.gettempdir(), f"chiptrace-duckdb-{os.getpid()}"),
    }
    if threads:
        config["threads"] = threads
    if memory_limit:
        config["memory_limit"] = memory_limit
    return config


def _read_parquet_sql(parts: list[Path]) -> str:
    """`read_parquet(...)` over `parts`. Columns come from the files, never from `key=value`
    folder names: DuckDB would otherwise replace `host`/`service` with the (escaped, bounded)
    partition folder's name (chiptrace collect --partition-by)."""
    files = ", ".join("'" + str(p).replace("'", "''") + "'" for p in parts)
    return f"read_parquet([{files}], union_by_name = true, hive_partitioning = false)"


# What a part's rows must hold, checked in one scan with the decoding (verify): every
# required column set, the JSON columns JSON. The analysis's json_extract fails the whole
# query on one malformed value, and a NULL time poisons every duration.
_REQUIRED = [f.name for f in SPAN_SCHEMA if not f.nullable]
_JSON_COLUMNS = ("attributes", "events", "links", "resource")
_NULLS = " OR ".join(f"{c} IS NULL" for c in _REQUIRED)
_NOT_JSON = " OR ".join(f"NOT coalesce(json_valid({c}), true)" for c in _JSON_COLUMNS)
_ROWS_SQL = (
    "SELECT filename, {decode}, count(*) FILTER (WHERE {nulls}) AS nulls, "
    "count(*) FILTER (WHERE {not_json}) AS not_json FROM {source} GROUP BY filename"
)


def _rows_reason(nulls: int, not_json: int) -> str | None:
    if nulls:
        return f"{nulls} rows with NULL in a required column ({', '.join(_REQUIRED)})"
    if not_json:
        return f"{not_json} rows whose {'/'.join(_JSON_COLUMNS)} are not JSON"
    return None


def rows_problem(table: pa.Table) -> str | None:
    """Why the rows of a part read into Arrow cannot be used, by the rules verify applies
    (NULL in a required column, JSON columns that are not JSON), or None. Only the
    columns `table` has are checked."""
    names = set(table.column_names)
    if not names & set(_JSON_COLUMNS):  # no JSON to check: Arrow's null masks, no DuckDB
        # (~60 ms a part less for the viewer's column subset)
        masks = [table.column(c).is_null() for c in _REQUIRED if c in names]
        n = pc.sum(functools.reduce(pc.or_, masks)).as_py() if masks else 0
        return _rows_reason(n or 0, 0)
    nulls = " OR ".join(f"{c} IS NULL" for c in _REQUIRED if c in names) or "false"
    bad_json = " OR ".join(
        f"NOT coalesce(json_valid({c}), true)" for c in _JSON_COLUMNS if c in names
    )
    con = duckdb.connect()
    try:
        con.register("part", table)
        n, j = con.sql(
            f"SELECT count(*) FILTER (WHERE {nulls}), "
            f"count(*) FILTER (WHERE {bad_json or 'false'}) FROM part"
        ).fetchall()[0]
    finally:
        con.close()
    return _rows_reason(n, j)


def readable_parts(con: duckdb.DuckDBPyConnection, parts: list[Path]) -> list[Path]:
    """`parts` minus those with a data page that does not decode, a NULL in a required
    column, or a JSON column that is not JSON (each skipped with a warning naming it).
    One scan over all of them; only when a page fails to decode, one per part."""

    def scan(files: list[Path]) -> dict[str, str] | None:
        """Bad file -> reason, or None when a page does not decode."""
        source = _read_parquet_sql(files).replace(
            "hive_partitioning = false", "hive_partitioning = false, filename = true"
        )
        sql = _ROWS_SQL.format(
            decode="min(hash(COLUMNS(* EXCLUDE (filename))))",
            nulls=_NULLS,
            not_json=_NOT_JSON,
            source=source,
        )
        try:
            rows = con.sql(f"SELECT filename, nulls, not_json FROM ({sql})").fetchall()
        except duckdb.Error:
            return None
        return {name: why for name, n, j in rows if (why := _rows_reason(n, j))}

    if not parts:
        return parts
    found = scan(parts)
    if found is None:  # a page that does not decode fails the scan: find it part by part
        found = {}
        for p in parts:
            one = scan([p])
            found.update(one if one is not None else {str(p): "a data page does not decode"})
    for p in parts:
        if str(p) in found:
            warn_skipped(p, found[str(p)])
    return [p for p in parts if str(p) not in found]


def attach_views(con: duckdb.DuckDBPyConnection, parts: list[Path]) -> None:
    """(Re)create the span views over `parts`; an empty list gives empty views."""
    if parts:
        con.execute(
            f"CREATE OR REPLACE VIEW spans_raw AS SELECT {', '.join(COLUMNS)} "
            f"FROM {_read_parquet_sql(parts)}"
        )
    else:
        con.register("_empty_spans", SPAN_SCHEMA.empty_table())
        con.execute("CREATE OR REPLACE VIEW spans_raw AS SELECT * FROM _empty_spans")
    rest = ", ".join(c for c in COLUMNS if c not in _HEX_IDS)
    con.execute(SPANS_VIEW.format(rest=rest))
    con.execute(CHIPS_VIEW)
    con.execute(LINKS_VIEW)


def attach_metrics(con: duckdb.DuckDBPyConnection, dirs: list[Path]) -> None:
    """(Re)create the `metrics` view over DIR/metrics parts; empty, with its columns, if none."""
    # A part file given directly is a span part; metrics come from whole trace dirs only.
    parts, bad = good_parts([d for d in dirs if d.is_dir()], METRICS_TABLE, METRICS_SCHEMA)
    for path, reason in bad:
        warn_skipped(path, reason)
    if parts:
        source = _read_parquet_sql(parts)
    else:
        con.register("_empty_metrics", METRICS_SCHEMA.empty_table())
        source = "_empty_metrics"
    con.execute(
        f"CREATE OR REPLACE VIEW metrics AS SELECT {', '.join(METRIC_COLUMNS)}, "
        f"make_timestamp(ts_ns // 1000) AS sample_time FROM {source}"
    )


def run_sql(con: duckdb.DuckDBPyConnection, sql: str) -> pa.Table:
    """Run SQL and return an Arrow table.

    Raises:
        QueryError: DuckDB rejected the SQL (the message is DuckDB's first line).
    """
    try:
        rel = con.sql(sql)
        if rel is None:
            return pa.table({})
        return rel.to_arrow_table() if hasattr(rel, "to_arrow_table") else rel.arrow()
    except duckdb.Error as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise QueryError(f"SQL error: {first}") from e


def format_cell(value: object, null: str = "NULL") -> str:
    """One SQL result cell as text, as `chiptrace query` and the viewer's SQL console show it:
    ids (BLOBs) as hex, floats to 6 significant digits, NULL as `null`."""
    if value is None:
        return null
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


def is_data_error(error: BaseException) -> bool:
    """Whether a QueryError came from the data (a page that does not decode), not the SQL."""
    cause = error.__cause__
    user = (duckdb.ParserException, duckdb.BinderException, duckdb.CatalogException)
    return isinstance(cause, duckdb.Error) and not isinstance(cause, user)


__all__ = ["connect", "attach_views", "run_sql", "StoreError"]
