"""Fixtures for host sampling: real samplers on this machine, read back through DuckDB."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

import chiptrace


class Captured(logging.Handler):
    """Collects chiptrace log records, whatever `propagate` an earlier CLI run left set."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def messages(self, level: int = logging.WARNING) -> list[str]:
        return [r.getMessage() for r in self.records if r.levelno >= level]


@pytest.fixture
def chiptrace_log() -> Iterator[Captured]:
    logger = logging.getLogger("chiptrace")
    handler = Captured()
    old_level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    yield handler
    logger.removeHandler(handler)
    logger.setLevel(old_level)


def metric_rows(directory: Path, sql_where: str = "TRUE") -> list[dict]:
    """Rows of the `metrics` view of a trace dir, as dicts."""
    con = chiptrace.connect(directory, allow_empty=True)
    return (
        con.sql(f"SELECT * FROM metrics WHERE {sql_where} ORDER BY ts_ns")
        .to_arrow_table()
        .to_pylist()
    )
