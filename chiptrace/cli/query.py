"""`chiptrace query DIR... "SQL"`: DuckDB SQL over one or more trace dirs."""

from __future__ import annotations

import argparse
import io
import json
import sys
from typing import Any

NAME = "query"
ORDER = 20
HELP = "run SQL over trace dirs (views: spans, chips, links, runs, metrics)"
DESCRIPTION = (
    "Run DuckDB SQL over one or more trace directories (globs allowed) as one dataset. "
    "Views: spans, spans_raw, chips, links, runs, metrics, plus the analysis macros (see docs/sql.md)."
)
FORMATS = ("table", "csv", "json", "parquet")
_HINTS = ("Did you mean", "Candidate bindings")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("dirs", nargs="+", metavar="DIR", help="trace dir(s) or glob(s)")
    p.add_argument("sql", metavar="SQL", help="the query")
    p.add_argument("--format", "-f", choices=FORMATS, default="table")
    p.add_argument("-o", "--output", metavar="FILE", help="write to FILE instead of stdout")
    p.add_argument("--max-rows", type=int, default=100, help="rows shown in table format")
    from chiptrace.cli._runs import add_run_argument

    add_run_argument(p)


def format_table(table: Any, max_rows: int = 100) -> str:
    """Aligned text table of an Arrow table, numbers right-aligned."""
    import pyarrow as pa

    from chiptrace.query import format_cell

    names = table.column_names
    shown = table.slice(0, max_rows).to_pylist()
    rows = [[format_cell(r[n]) for n in names] for r in shown]
    numeric = [pa.types.is_integer(t) or pa.types.is_floating(t) for t in table.schema.types]
    widths = [max([len(n)] + [len(r[i]) for r in rows]) for i, n in enumerate(names)]
    widths = [min(w, 60) for w in widths]

    def line(cells: list[str]) -> str:
        out = []
        for c, w, num in zip(cells, widths, numeric, strict=False):
            c = c if len(c) <= w else c[: w - 1] + "…"
            out.append(c.rjust(w) if num else c.ljust(w))
        return "  ".join(out).rstrip()

    text = [line(names), "  ".join("-" * w for w in widths)]
    text += [line(r) for r in rows]
    more = max(table.num_rows - len(shown), 0)
    text.append(
        f"({table.num_rows} row{'s' if table.num_rows != 1 else ''}"
        + (f", {more} not shown; use --max-rows or --format csv" if more else "")
        + ")"
    )
    return "\n".join(text) + "\n"


def _json_default(v: Any) -> Any:
    if isinstance(v, bytes):
        return v.hex()
    return str(v)


def write_result(table: Any, fmt: str, output: str | None, max_rows: int = 100) -> None:
    """Write an Arrow table in `fmt` to `output` (a path) or stdout."""
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq

    from chiptrace.errors import ChiptraceError

    if fmt == "parquet":
        if output is None and sys.stdout.isatty():
            raise ChiptraceError("--format parquet writes binary: give -o FILE or redirect stdout")
        buf = io.BytesIO()
        pq.write_table(table, buf, compression="zstd")
        data = buf.getvalue()
    elif fmt == "csv":
        buf = io.BytesIO()
        pacsv.write_csv(table, buf)
        data = buf.getvalue()
    elif fmt == "json":
        data = (json.dumps(table.to_pylist(), default=_json_default, indent=1) + "\n").encode()
    else:
        data = format_table(table, max_rows).encode()
    if output:
        try:
            with open(output, "wb") as fh:
                fh.write(data)
        except OSError as e:
            raise ChiptraceError(f"cannot write {output}: {e.strerror}") from e
    else:
        sys.stdout.buffer.write(data)
        sys.stdout.flush()


def run(args: argparse.Namespace) -> int:
    from chiptrace.cli._runs import pick
    from chiptrace.errors import QueryError
    from chiptrace.query import connect, is_data_error, run_sql

    if not args.sql.strip().strip(";").strip():
        raise QueryError(
            "empty SQL: give a query, e.g. chiptrace query DIR 'SELECT count(*) FROM spans'"
        )
    runs = pick(args.dirs, args.run, "query")
    if len(runs) > 1:  # one dataset, as asked; but say that it mixes runs
        listed = "; ".join(r.describe() for r in runs)
        sys.stderr.write(
            f"chiptrace: note: {len(runs)} runs queried as one ({listed}); "
            "--run ID queries one of them\n"
        )
    args.dirs = [p for r in runs for p in r.paths]
    con = connect(args.dirs)
    try:
        table = run_sql(con, args.sql)
    except QueryError as e:
        if not is_data_error(e):
            raise _with_hints(e) from e.__cause__
        # A data page that does not decode (the footer was fine): find the part, skip it
        # with a warning, and answer from the rest.
        table = run_sql(connect(args.dirs, verify=True), args.sql)
    write_result(table, args.format, args.output, args.max_rows)
    return 0


def _with_hints(error: Exception) -> Exception:
    """The SQL error with DuckDB's hints (`Did you mean "spans"?`, `Candidate bindings:`),
    which run_sql's first line leaves out: they are the way to the right query."""
    lines = str(error.__cause__ or "").strip().splitlines()
    hints = [h.strip() for h in lines[1:] if h.strip().startswith(_HINTS)]
    if not hints:
        return error
    return type(error)(" ".join([str(error), *hints]))
