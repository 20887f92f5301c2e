"""The spool keeps what it took: failed parts stay and are retried; refusals say why."""

from __future__ import annotations

import threading
from pathlib import Path

import pyarrow as pa
import pytest

import chiptrace
from chiptrace.collector.sink import (
    MAX_FOLDER_VALUE,
    NULL_PARTITION,
    PartitionedStoreSink,
    folder_value,
    partition_groups,
)
from chiptrace.collector.spool import PartialWrite, Spool, SpoolLimits, StoreUnavailable
from chiptrace.collector.wal import PartTag
from chiptrace.schema import batch_from_columns, ids_to_binary, trace_ids_to_binary
from chiptrace.store import PartWriter
from tests.waiting import wait_until


def spans(first: int, n: int, **columns: object) -> pa.RecordBatch:
    return batch_from_columns(
        {
            "trace_id": trace_ids_to_binary([bytes([1]) * 16] * n),
            "span_id": ids_to_binary(range(first, first + n)),
            "name": "s",
            "start_ns": [1_700_000_000 * 10**9 + i for i in range(n)],
            "end_ns": [1_700_000_000 * 10**9 + i + 1 for i in range(n)],
            **columns,
        }
    )


def stored_ids(out: Path) -> list[int]:
    con = chiptrace.connect(out)
    return sorted(int(r[0], 16) for r in con.sql("SELECT span_id FROM spans").fetchall())


class FlakySink:
    """Fails its first `failures` writes, then writes to a real store."""

    def __init__(self, writer: PartWriter, failures: int) -> None:
        self.sink = PartitionedStoreSink(writer)
        self.failures = failures
        self.calls = 0

    def write(self, table: pa.Table, tag: PartTag | None = None) -> None:
        self.calls += 1
        if self.calls <= self.failures:
            raise OSError(28, "No space left on device")
        self.sink.write(table, tag)


def test_a_failed_write_is_kept_retried_and_refuses_meanwhile(tmp_path: Path) -> None:
    sink = FlakySink(PartWriter(tmp_path / "t"), failures=1)
    spool = Spool(sink, SpoolLimits(flush_interval_s=0.01))
    spool.offer(spans(1, 10))
    wait_until(lambda: spool.last_error, "the first write to fail")
    with pytest.raises(StoreUnavailable, match="No space left") as refused:
        spool.offer(spans(100, 1))
    assert refused.value.retry_after_s >= 1
    wait_until(lambda: spool.pending == 0, "the retry")
    assert spool.stored == 10
    spool.offer(spans(200, 5))  # writable again: accepted
    spool.close()
    assert spool.unwritten == 0
    assert stored_ids(tmp_path / "t") == [*range(1, 11), *range(200, 205)]
    assert spool.stored == 15


def test_close_reports_what_could_not_be_written(tmp_path: Path) -> None:
    sink = FlakySink(PartWriter(tmp_path / "t"), failures=1_000)
    spool = Spool(sink, SpoolLimits(flush_interval_s=3600))
    spool.offer(spans(1, 7))
    spool.close()
    assert (spool.stored, spool.unwritten) == (0, 7)
    assert "No space left" in spool.last_error
    with pytest.raises(StoreUnavailable, match="shutting down"):
        spool.offer(spans(50, 1))


def test_a_waiting_request_gets_a_flush_not_the_interval(tmp_path: Path) -> None:
    """--max-buffered below --flush-spans: a full buffer is written at once for the request
    waiting, instead of waiting out the interval (throughput fell 88x)."""
    writer = PartWriter(tmp_path / "t")
    limits = SpoolLimits(flush_interval_s=3600, flush_spans=1_000_000, max_spans=1_000)
    spool = Spool(PartitionedStoreSink(writer), limits)
    for i in range(20):
        spool.offer(spans(1 + i * 400, 400))  # raises StoreUnavailable after 2 s of waiting
    assert writer.parts_written >= 5  # flushed by size while the hour-long interval ran
    spool.close()
    assert len(stored_ids(tmp_path / "t")) == 8_000


def test_byte_bound_refuses_after_waiting(tmp_path: Path) -> None:
    gate = threading.Event()

    class Stuck:
        def write(self, table: pa.Table, tag: PartTag | None = None) -> None:
            gate.wait(30)

    limits = SpoolLimits(flush_interval_s=0.01, max_bytes=1 << 20, wait_s=0.2)
    spool = Spool(Stuck(), limits)
    big = spans(1, 10, attributes=["x" * (200 << 10)] * 10)  # ~2 MB
    spool.offer(big)  # alone: taken even over the bound
    with pytest.raises(StoreUnavailable, match="behind"):
        spool.offer(spans(100, 10, attributes=["y" * (200 << 10)] * 10))
    gate.set()
    spool.close()
    assert spool.stored == 10


def test_partitions_escaped_bounded_and_values_exact(tmp_path: Path) -> None:
    long_name = "s" * 300
    services = ["payment service", long_name, "a/b=c%d", "ünï", None, ""]
    batch = spans(1, 6, service=services, host=["node1"] * 6)
    out = tmp_path / "t"
    PartitionedStoreSink(PartWriter(out), ("service", "host")).write(pa.Table.from_batches([batch]))
    folders = {p.parent.name for p in (out / "spans").rglob("*.parquet")}
    assert "payment%20service" in {f.split("=", 1)[1] for f in _service_folders(out)}
    assert all(len(f.encode()) <= len("service=") + MAX_FOLDER_VALUE for f in _service_folders(out))
    assert folders == {"host=node1"}
    con = chiptrace.connect(out)
    got = dict(con.sql("SELECT span_id, service FROM spans").fetchall())
    assert sorted(got.values(), key=str) == sorted(services, key=str)
    assert con.sql("SELECT count(*) FROM spans WHERE service = 'payment service'").fetchall() == [
        (1,)
    ]


def _service_folders(out: Path) -> set[str]:
    return {p.parent.parent.name for p in (out / "spans").rglob("*.parquet")}


def test_folder_value_is_hive_encoding_and_distinct_when_cut() -> None:
    assert folder_value("node-1.local") == "node-1.local"
    assert folder_value("a b/c") == "a%20b%2Fc"
    assert folder_value(None) == folder_value("") == NULL_PARTITION
    a, b = folder_value("x" * 500 + "1"), folder_value("x" * 500 + "2")
    assert a != b and len(a) <= MAX_FOLDER_VALUE and "~" in a
    cut = folder_value("%" * 100)  # a cut never splits an escape
    assert len(cut) <= MAX_FOLDER_VALUE and cut.split("~")[0].count("%") * 3 == len(
        cut.split("~")[0]
    )


def test_one_bad_partition_costs_only_its_own_rows(tmp_path: Path) -> None:
    out = tmp_path / "t"
    sink = PartitionedStoreSink(PartWriter(out), ("service",))
    (out / "spans").mkdir(parents=True, exist_ok=True)
    (out / "spans" / "service=bad").write_text("a file where a folder should be")
    batch = spans(1, 9, service=["good", "bad", "other"] * 3)
    with pytest.raises(StoreUnavailable, match="service=bad"):
        sink.prepare(batch)  # refused to its client before it is acknowledged
    with pytest.raises(PartialWrite) as partial:
        sink.write(pa.Table.from_batches([batch]))
    assert partial.value.unwritten.column("service").to_pylist() == ["bad"] * 3
    assert len(stored_ids(out)) == 6


def test_partition_groups_cover_every_row_once() -> None:
    batch = spans(1, 50, service=[f"s{i % 7}" for i in range(50)], host=None)
    groups = partition_groups(pa.Table.from_batches([batch]), ("date", "service", "host"))
    rows = sorted(int(i) for g in groups.values() for i in g)
    assert rows == list(range(50)) and len(groups) == 7
    assert all(p.endswith(f"/host={NULL_PARTITION}") for p in groups)
