"""chiptrace: find what holds a multi-chip AI system back.

Instrument code with `@chiptrace.trace(chip="gpu:0")` and `with chiptrace.span(...)`,
query the Parquet trace store with `chiptrace.connect(DIR)`. Importing chiptrace loads
the OpenTelemetry API only: never NumPy or pyarrow (the recorder loads them on its
writer thread), the viewer (Textual) or the exporters.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from chiptrace import lifecycle as _lifecycle
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
from chiptrace.vocab import CHIP_TYPES, LINK_TYPES, OP_KINDS, PRECISIONS

if TYPE_CHECKING:
    import duckdb

    from chiptrace.config import Config
    from chiptrace.importers import ImportSummary
    from chiptrace.lifecycle import Sampler
    from chiptrace.recorder import SpanSink

_Paths = str | os.PathLike[str] | Iterable[str | os.PathLike[str]]


def connect(paths: _Paths, **kwargs: Any) -> duckdb.DuckDBPyConnection:
    """DuckDB over trace dir(s); see `chiptrace.query.connect`. DuckDB loads on first use."""
    from chiptrace.query import connect as _connect

    return _connect(paths, **kwargs)


def import_trace(paths: _Paths, out: str | os.PathLike[str], **kwargs: Any) -> ImportSummary:
    """Import Kineto / Chrome / OTLP / Jaeger files into a trace dir; see
    `chiptrace.importers.import_trace`. The importers (and msgspec) load on first use."""
    from chiptrace.importers import import_trace as _import_trace

    return _import_trace(paths, out, **kwargs)


# What init() starts from layers the core may not import (lifecycle.EXTENSIONS). Set here,
# when chiptrace is first imported: before any chiptrace module can call init().
def _otlp_sink(config: Config) -> SpanSink:
    """chiptrace's columnar OTLP encoder, for `init(otlp_endpoint=...)`."""
    from chiptrace.exporters.otlp import OtlpSink

    return OtlpSink(config.otlp_endpoint)


def _host_sampler(config: Config, interval: float) -> Sampler:
    """The host sampler for `init(sample_host=True)`; psutil and NVML load only then."""
    from chiptrace.host.sampler import HostSampler

    return HostSampler(
        config.dir,
        interval=interval,
        run_id=config.run_id,
        service=config.service,
        host=config.host,
    ).start()


_lifecycle.EXTENSIONS.otlp_sink = _otlp_sink
_lifecycle.EXTENSIONS.host_sampler = _host_sampler


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
