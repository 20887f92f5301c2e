"""Where collected spans go: the Parquet store, optionally hive-partitioned.

`--partition-by date,host` writes `spans/date=2026-11-30/host=node1/part-*.parquet`, the
layout DuckDB (`hive_partitioning`), Spark and Trino read as one dataset. The date is the
span's start in UTC; a span without a host goes under Hive's null partition
(`host=__HIVE_DEFAULT_PARTITION__`), which readers turn back into NULL.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from chiptrace.errors import ConfigError
from chiptrace.store import PartWriter

PARTITION_KEYS = ("date", "host", "service")
# Hive's name for a null partition value: DuckDB, Spark and Trino read it back as NULL.
NULL_PARTITION = "__HIVE_DEFAULT_PARTITION__"
_UNSAFE = re.compile(r"[^A-Za-z0-9._:-]")


def parse_partition_by(text: str | None) -> tuple[str, ...]:
    """`date,host` -> ("date", "host").

    Raises:
        ConfigError: an unknown key.
    """
    if not text:
        return ()
    keys = tuple(k.strip() for k in text.split(",") if k.strip())
    for k in keys:
        if k not in PARTITION_KEYS:
            raise ConfigError(
                f"--partition-by {text!r}: unknown key {k!r}; expected some of {', '.join(PARTITION_KEYS)}"
            )
    return keys


def _values(batch: pa.RecordBatch, key: str) -> list[str]:
    if key == "date":
        start = batch.column("start_ns").to_numpy(zero_copy_only=False)
        return np.datetime_as_string(start.astype("datetime64[ns]"), unit="D").tolist()
    col = batch.column(key)
    if pa.types.is_dictionary(col.type):
        col = col.cast(pa.string())
    return [_UNSAFE.sub("_", v) if v else NULL_PARTITION for v in col.to_pylist()]


class PartitionedStoreSink:
    """A recorder sink writing each flushed batch as parts, split by partition keys.

    Args:
        writer: the PartWriter of the output directory.
        partition_by: keys from PARTITION_KEYS; empty means one flat `spans/` folder.
    """

    def __init__(self, writer: PartWriter, partition_by: Sequence[str] = ()) -> None:
        self.writer = writer
        self.partition_by = tuple(partition_by)

    def write(self, batch: pa.RecordBatch) -> None:
        if not self.partition_by:
            self.writer.write(batch)
            return
        columns = [_values(batch, k) for k in self.partition_by]
        paths = [
            "/".join(f"{k}={v}" for k, v in zip(self.partition_by, vals, strict=True))
            for vals in zip(*columns, strict=True)
        ]
        keys = pc.dictionary_encode(pa.array(paths))
        table = pa.Table.from_batches([batch])
        for i, path in enumerate(keys.dictionary.to_pylist()):
            part = table.filter(pc.equal(keys.indices, i))
            self.writer.write(part, partition=path)

    def close(self) -> None:
        pass
