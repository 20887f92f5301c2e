"""The metrics schema: host samples in long format, one row per (time, chip, metric).

Spans say what ran where; metrics say how busy the real hardware was meanwhile. They live
beside the spans in the same trace dir (`DIR/metrics/part-*.parquet`) and the same run, and
DuckDB shows them as the `metrics` view (see docs/host.md for every metric name).

Chip ids follow the span schema's `TYPE:INDEX`: `cpu:N` is logical CPU N, `gpu:N` is NVML
device N, and `nic:N` is the network interface whose kernel index (`if_nametoindex`) is N,
with its name (`lo`, `eth0`) in the `device` column. Host-wide series (memory, disks) have
no chip: `chip_id` is null and `device` names the thing (`memory`, `sda`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pyarrow as pa

METRICS_TABLE = "metrics"
METRICS_SCHEMA_VERSION = 1
METRICS_SCHEMA_VERSION_KEY = b"chiptrace.metrics_schema_version"

SOURCE_REAL = "real"
SOURCE_EMULATED = "emulated"

# Plain strings in memory: dictionary-encoding a few hundred rows in Arrow costs ~1 ms a
# column, ten times the sampling itself. Parquet dictionary-encodes them on disk anyway.
_STR = pa.string()

METRICS_SCHEMA = pa.schema(
    [
        pa.field("ts_ns", pa.int64(), nullable=False),
        pa.field("host", _STR, nullable=False),
        pa.field("chip_id", _STR),
        pa.field("chip_type", _STR),
        pa.field("device", _STR),
        pa.field("metric", _STR, nullable=False),
        pa.field("value", pa.float64(), nullable=False),
        pa.field("unit", _STR, nullable=False),
        pa.field("source", _STR, nullable=False),
        pa.field("run_id", _STR),
        pa.field("pid", pa.int32()),
    ],
    metadata={METRICS_SCHEMA_VERSION_KEY: str(METRICS_SCHEMA_VERSION).encode()},
)
METRIC_COLUMNS = tuple(METRICS_SCHEMA.names)

# Samples repeat hosts, chips and metric names and carry increasing times.
METRICS_WRITE_OPTIONS = {
    "compression": "zstd",
    "compression_level": 3,
    "use_dictionary": [c for c in METRIC_COLUMNS if c not in ("ts_ns", "value", "pid")],
    "column_encoding": {"ts_ns": "DELTA_BINARY_PACKED"},
    "write_statistics": ["ts_ns", "chip_id", "chip_type", "metric"],
}

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
