"""One exception family: the CLI turns any of these into one line on stderr and an exit code."""

from __future__ import annotations


class ChiptraceError(Exception):
    """Root of every error chiptrace raises on purpose (a user mistake or bad input)."""

    exit_code = 2


class ConfigError(ChiptraceError):
    """A setting (keyword argument or environment variable) has a bad value."""


class ChipError(ChiptraceError, ValueError):
    """A chip, link or attribute value outside the span schema."""


class StoreError(ChiptraceError):
    """A trace directory or Parquet part that cannot be read or written."""


class SchemaVersionError(StoreError):
    """A part written by a newer chiptrace than this one."""


class QueryError(ChiptraceError):
    """SQL that DuckDB rejected."""
