"""Real hardware beside the emulated rack: host CPUs, memory, NICs, disks and NVIDIA GPUs.

`HostSampler(dir).start()` (or `chiptrace.init(sample_host=True)`, or `chiptrace record
-- CMD`) samples the machine on a daemon thread into the trace dir's `metrics` table,
which `chiptrace.connect(dir)` shows as the `metrics` view. See docs/host.md.
"""

from __future__ import annotations

from chiptrace.errors import ChiptraceError
from chiptrace.host.metrics import (
    METRICS_SCHEMA,
    METRICS_TABLE,
    SOURCE_EMULATED,
    SOURCE_REAL,
    UNITS,
    Sample,
    empty_metrics,
    metrics_batch,
)


class HostError(ChiptraceError):
    """Host sampling or `chiptrace record` could not do what was asked (e.g. no such command)."""


# The sampler (psutil, threads) loads on first use: `from chiptrace.host import UNITS`
# should not start importing psutil.
_LAZY = {"HostSampler", "DEFAULT_INTERVAL_S"}


def __getattr__(name: str) -> object:
    if name in _LAZY:
        from chiptrace.host import sampler

        return getattr(sampler, name)
    raise AttributeError(f"module 'chiptrace.host' has no attribute {name!r}")


__all__ = [
    "HostSampler",
    "HostError",
    "DEFAULT_INTERVAL_S",
    "METRICS_SCHEMA",
    "METRICS_TABLE",
    "SOURCE_REAL",
    "SOURCE_EMULATED",
    "UNITS",
    "Sample",
    "empty_metrics",
    "metrics_batch",
]
