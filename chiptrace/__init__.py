"""chiptrace: find what holds a multi-chip AI system back.

Instrument code with `@chiptrace.trace(chip="gpu:0")` and `with chiptrace.span(...)`,
query the Parquet trace store with `chiptrace.connect(DIR)`. Importing chiptrace loads
OpenTelemetry and pyarrow, never the viewer (Textual) or the exporters.
"""

from __future__ import annotations

from chiptrace._version import __version__
from chiptrace.api import (
    Span,
    carry,
    current_span,
    flush,
    get_recorder,
    init,
    shutdown,
    span,
    trace,
)
from chiptrace.errors import (
    ChipError,
    ChiptraceError,
    ConfigError,
    QueryError,
    SchemaVersionError,
    StoreError,
)
from chiptrace.propagation import extract, in_context, inject, subprocess_env
from chiptrace.schema import CHIP_TYPES, LINK_TYPES, OP_KINDS, PRECISIONS


def connect(paths, **kwargs):  # type: ignore[no-untyped-def]
    """DuckDB over trace dir(s); see `chiptrace.query.connect`. DuckDB loads on first use."""
    from chiptrace.query import connect as _connect

    return _connect(paths, **kwargs)


def import_trace(paths, out, **kwargs):  # type: ignore[no-untyped-def]
    """Import Kineto / Chrome / OTLP / Jaeger files into a trace dir; see
    `chiptrace.importers.import_trace`. The importers (and msgspec) load on first use."""
    from chiptrace.importers import import_trace as _import_trace

    return _import_trace(paths, out, **kwargs)


__all__ = [
    "__version__",
    "trace",
    "span",
    "Span",
    "init",
    "shutdown",
    "flush",
    "carry",
    "current_span",
    "get_recorder",
    "connect",
    "import_trace",
    "inject",
    "extract",
    "in_context",
    "subprocess_env",
    "ChiptraceError",
    "ChipError",
    "ConfigError",
    "StoreError",
    "SchemaVersionError",
    "QueryError",
    "CHIP_TYPES",
    "LINK_TYPES",
    "OP_KINDS",
    "PRECISIONS",
]
