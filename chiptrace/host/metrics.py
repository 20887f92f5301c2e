"""Host metrics: their names and units, and the buffer samples go into before Parquet.

Spans say what ran where; metrics say how busy the real hardware was meanwhile. They live
beside the spans in the same trace dir (`DIR/metrics/part-*.parquet`) and the same run, and
DuckDB shows them as the `metrics` view (see docs/host.md for every metric name). The
table's schema is chiptrace.schema's (METRICS_SCHEMA), re-exported here, so the query
layer opens the view without importing this package.

Chip ids follow the span schema's `TYPE:INDEX`: `cpu:N` is logical CPU N, `gpu:N` is NVML
device N, and `nic:N` is the network interface whose kernel index (`if_nametoindex`) is N,
with its name (`lo`, `eth0`) in the `device` column. Host-wide series (memory, disks) have
no chip: `chip_id` is null and `device` names the thing (`memory`, `sda`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pyarrow as pa

from chiptrace.schema import (
    METRIC_COLUMNS,
    METRICS_SCHEMA,
    METRICS_SCHEMA_VERSION,
    METRICS_SCHEMA_VERSION_KEY,
    METRICS_TABLE,
    METRICS_WRITE_OPTIONS,
    SOURCE_EMULATED,
    SOURCE_REAL,
)

_STR = pa.string()  # plain strings: see METRICS_SCHEMA

# metric name -> unit. One vocabulary, so the report, the viewer and SQL agree on names.
UNITS = {
    "cpu.util": "percent",
    "mem.used": "bytes",
    "mem.available": "bytes",
    "mem.util": "percent",
    "nic.rx_bytes": "bytes",
    "nic.tx_bytes": "bytes",
    "nic.rx_bytes_per_s": "bytes/s",
    "nic.tx_bytes_per_s": "bytes/s",
    "disk.read_bytes_per_s": "bytes/s",
    "disk.write_bytes_per_s": "bytes/s",
    "disk.read_ops_per_s": "ops/s",
    "disk.write_ops_per_s": "ops/s",
    "disk.busy": "percent",
    "proc.cpu": "percent",
    "proc.cpu_seconds": "seconds",
    "proc.rss": "bytes",
    "gpu.util": "percent",
    "gpu.mem_util": "percent",
    "gpu.mem_used": "bytes",
    "gpu.mem_total": "bytes",
    "gpu.power": "watts",
    "gpu.temperature": "celsius",
    "pcie.rx_bytes_per_s": "bytes/s",
    "pcie.tx_bytes_per_s": "bytes/s",
    "nvlink.rx_bytes_per_s": "bytes/s",
    "nvlink.tx_bytes_per_s": "bytes/s",
}


@dataclass(frozen=True, slots=True)
class Sample:
    """One reading: `metric` of `chip_id` (or of `device` when host-wide) is `value`."""

    metric: str
    value: float
    chip_id: str | None = None
    chip_type: str | None = None
    device: str | None = None


@dataclass
class SampleBuffer:
    """Column lists that samples append to; `take()` turns them into one Arrow batch.

    Args:
        host: host name stamped on every row.
        run_id: the run the samples belong to (the spans' run id).
        pid: the sampling process.
        source: `real` for measured hardware, `emulated` for the emulated rack.
    """

    host: str
    run_id: str | None = None
    pid: int | None = None
    source: str = SOURCE_REAL
    _cols: dict[str, list] = field(default_factory=lambda: _empty_columns())

    def __len__(self) -> int:
        return len(self._cols["ts_ns"])

    def add(self, ts_ns: int, samples: list[Sample]) -> None:
        """Append readings taken at `ts_ns` (Unix nanoseconds)."""
        c = self._cols
        values = [float(s.value) for s in samples]  # first: a bad value leaves no ragged row
        for s, v in zip(samples, values, strict=True):
            c["ts_ns"].append(ts_ns)
            c["chip_id"].append(s.chip_id)
            c["chip_type"].append(s.chip_type)
            c["device"].append(s.device)
            c["metric"].append(s.metric)
            c["value"].append(v)
            c["unit"].append(UNITS.get(s.metric, ""))

    def take(self) -> pa.RecordBatch | None:
        """Everything buffered as one metrics batch (None when empty); the buffer empties."""
        cols, self._cols = self._cols, _empty_columns()
        n = len(cols["ts_ns"])
        if not n:
            return None
        return metrics_batch(cols, self.host, self.run_id, self.pid, self.source)


def _empty_columns() -> dict[str, list]:
    return {k: [] for k in ("ts_ns", "chip_id", "chip_type", "device", "metric", "value", "unit")}


def _strings(values: list | str | None, n: int | None = None) -> pa.Array:
    if n is not None:  # one value for every row
        return pa.array([values] * n, _STR)
    return pa.array(values, _STR)


def metrics_batch(
    cols: dict[str, list],
    host: str,
    run_id: str | None,
    pid: int | None,
    source: str = SOURCE_REAL,
) -> pa.RecordBatch:
    """Build a metrics RecordBatch from per-row lists plus per-run constants."""
    n = len(cols["ts_ns"])
    arrays = [
        pa.array(cols["ts_ns"], pa.int64()),
        _strings(host, n),
        _strings(cols["chip_id"]),
        _strings(cols["chip_type"]),
        _strings(cols["device"]),
        _strings(cols["metric"]),
        pa.array(cols["value"], pa.float64()),
        _strings(cols["unit"]),
        _strings(source, n),
        _strings(run_id, n),
        pa.array([pid] * n, pa.int32()),
    ]
    return pa.RecordBatch.from_arrays(arrays, schema=METRICS_SCHEMA)


def empty_metrics() -> pa.Table:
    """A metrics table with no rows, for readers that must return the schema anyway."""
    return METRICS_SCHEMA.empty_table()


__all__ = [
    "METRIC_COLUMNS",
    "METRICS_SCHEMA",
    "METRICS_SCHEMA_VERSION",
    "METRICS_SCHEMA_VERSION_KEY",
    "METRICS_TABLE",
    "METRICS_WRITE_OPTIONS",
    "SOURCE_EMULATED",
    "SOURCE_REAL",
    "UNITS",
    "Sample",
    "SampleBuffer",
    "empty_metrics",
    "metrics_batch",
]
