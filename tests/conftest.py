"""Shared fixtures: real trace directories in tmp_path, real recorders, real DuckDB."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

import chiptrace


@pytest.fixture
def trace_dir(tmp_path: Path) -> Iterator[Path]:
    """A recorder writing into tmp_path/trace; flushed and stopped after the test."""
    out = tmp_path / "trace"
    chiptrace.init(out, service="test", flush_interval_s=60)
    yield out
    chiptrace.shutdown()


def spans_by_name(directory: Path) -> dict[str, list[dict]]:
    """Flush, then read every span back through DuckDB, grouped by name."""
    chiptrace.flush()
    con = chiptrace.connect(directory)
    try:
        rows = con.sql("SELECT * FROM spans ORDER BY start_ns").to_arrow_table().to_pylist()
    finally:
        con.close()  # a connection left to the garbage collector can be freed in a forked child
    out: dict[str, list[dict]] = {}
    for r in rows:
        out.setdefault(r["name"], []).append(r)
    return out


def assert_span_tree(rows: list[dict], expected: dict[str, str | None]) -> None:
    """Check that each span named in `expected` has the parent named there (None: root)."""
    by_id = {r["span_id"]: r for r in rows}
    for r in rows:
        if r["name"] not in expected:
            continue
        parent = by_id.get(r["parent_span_id"]) if r["parent_span_id"] else None
        want = expected[r["name"]]
        got = parent["name"] if parent else None
        assert got == want, f"{r['name']}: parent {got!r}, expected {want!r}"
        if parent:
            assert parent["trace_id"] == r["trace_id"]
