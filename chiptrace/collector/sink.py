"""Where collected spans go: the Parquet store, optionally hive-partitioned.

`--partition-by date,host` writes `spans/date=2026-11-30/host=node1/part-*.parquet`, the
layout DuckDB (`hive_partitioning`), Spark and Trino read as one dataset. The date is the
span's start in UTC; a span without a host (or with an empty one) goes under Hive's null
partition (`host=__HIVE_DEFAULT_PARTITION__`).

Folder names only sort parts: the stored `host` and `service` columns keep every value
exactly as sent, and chiptrace reads the columns, never the folder names. A folder name is
the value percent-encoded as Hive does (anything but letters, digits, `.`, `_` and `-`),
so DuckDB, Spark and Trino read most values back exactly from the names too; a value whose
encoding is longer than MAX_FOLDER_VALUE keeps a prefix and a hash of the whole
(`service=aaaa...~3f2a9c0d11e4b7a2`), so no name is too long for the filesystem and two
values never share a folder by accident.

Each partition of a flushed part is written on its own: one that fails costs only its own
rows, which the spool keeps and retries (see spool.PartialWrite).
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import re
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from chiptrace.collector.compact import Compactor
from chiptrace.collector.spool import PartialWrite, StoreUnavailable
from chiptrace.collector.wal import PartTag
from chiptrace.errors import ConfigError
from chiptrace.store import SPAN_WRITE_OPTIONS, SPANS_DIR, PartWriter

log = logging.getLogger("chiptrace")

PARTITION_KEYS = ("date", "host", "service")
# Hive's name for a null partition value: DuckDB, Spark and Trino read it back as NULL.
NULL_PARTITION = "__HIVE_DEFAULT_PARTITION__"
MAX_FOLDER_VALUE = 120  # bytes of encoded value in one folder name (filesystems allow 255)
_HASH_CHARS = 16
_UNSAFE = re.compile(rb"[^A-Za-z0-9._-]")
_NS_PER_DAY = 86_400 * 10**9
_READY_LIMIT = 100_000  # partition folders remembered as created
# A part of fewer rows is written without compression: zstd's setup per column chunk was
# 0.5 of 0.9 ms CPU for a 20-row part (1,000 hosts' parts at SIGTERM), for 6% fewer bytes.
SMALL_PART_ROWS = 256
SMALL_PART_OPTIONS: dict[str, Any] = {
    **{k: v for k, v in SPAN_WRITE_OPTIONS.items() if k != "compression_level"},
    "compression": "none",
}


def sync_filesystem(path: Path) -> None:
    """syncfs(2) on the filesystem holding `path` (Linux); os.sync() elsewhere."""
    try:
        syncfs = ctypes.CDLL(None, use_errno=True).syncfs
    except (OSError, AttributeError):
        os.sync()
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        if syncfs(fd) != 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err))
    finally:
        os.close(fd)


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


def folder_value(value: str | None) -> str:
    """The folder-name form of a partition value: Hive's percent-encoding, bounded."""
    if not value:
        return NULL_PARTITION
    encoded = _UNSAFE.sub(lambda m: b"%%%02X" % m.group()[0], value.encode("utf-8")).decode()
    if len(encoded) <= MAX_FOLDER_VALUE:
        return encoded
    digest = hashlib.sha256(value.encode("utf-8")).hexdigest()[:_HASH_CHARS]
    head = encoded[: MAX_FOLDER_VALUE - _HASH_CHARS - 1]
    head = head[: head.rfind("%")] if "%" in head[-2:] else head  # no cut escape
    return f"{head}~{digest}"  # `~` is always escaped in a value, so this cannot collide


def _key_codes(table: pa.Table, key: str) -> tuple[np.ndarray, list[str]]:
    """Per row an index into the list of folder names of `key`'s values."""
    if key == "date":
        days = table.column("start_ns").to_numpy() // _NS_PER_DAY
        uniq, codes = np.unique(days, return_inverse=True)
        names = np.datetime_as_string(uniq.astype("datetime64[D]"), unit="D").tolist()
        return codes.astype(np.int64), names
    col = table.column(key).combine_chunks()
    if not pa.types.is_dictionary(col.type):
        col = pc.dictionary_encode(col)
    names = [folder_value(v) for v in col.dictionary.to_pylist()] + [NULL_PARTITION]
    codes = col.indices.fill_null(len(names) - 1).to_numpy(zero_copy_only=False)
    return codes.astype(np.int64), names


def partition_groups(table: pa.Table, keys: Sequence[str]) -> dict[str, np.ndarray]:
    """Partition path (`date=.../host=...`) -> the row indices that go under it."""
    codes = np.zeros(table.num_rows, dtype=np.int64)
    per_key = []
    for key in keys:
        key_codes, names = _key_codes(table, key)
        codes = codes * len(names) + key_codes
        per_key.append((key, names))
    groups: dict[str, list[np.ndarray]] = {}
    order = np.argsort(codes, kind="stable")
    uniq, starts = np.unique(codes[order], return_index=True)
    bounds = [*starts.tolist(), len(order)]
    for i, code in enumerate(uniq.tolist()):
        parts = []
        for key, names in reversed(per_key):
            code, idx = divmod(code, len(names))
            parts.append(f"{key}={names[idx]}")
        path = "/".join(reversed(parts))
        groups.setdefault(path, []).append(order[bounds[i] : bounds[i + 1]])
    return {p: np.sort(np.concatenate(rows)) for p, rows in groups.items()}


class PartitionedStoreSink:
    """The spool's sink: writes each part, split by partition keys, and the manifest.

    Args:
        writer: the PartWriter of the output directory.
        partition_by: keys from PARTITION_KEYS; empty means one flat `spans/` folder.
    """

    def __init__(self, writer: PartWriter, partition_by: Sequence[str] = ()) -> None:
        self.writer = writer
        self.partition_by = tuple(partition_by)
        # Parts merged per partition after flushes (partitioned collectors only).
        self.compactor = (
            Compactor(writer.writer_id, self.make_durable_all) if self.partition_by else None
        )
        self._ready: set[str] = set()
        self._unsynced: set[Path] = set()  # folders with parts written since make_durable
        self._dirs_lock = threading.Lock()

    def prepare(self, batch: pa.RecordBatch) -> None:
        """Create the folders a request's spans will go to, before it is acknowledged, so
        a partition that cannot be written is refused to its own client alone.

        Raises:
            StoreUnavailable: a folder cannot be created.
        """
        if not self.partition_by:
            return
        root = self.writer.directory / SPANS_DIR
        for path in partition_groups(pa.Table.from_batches([batch]), self.partition_by):
            if path in self._ready:
                continue
            try:
                (root / path).mkdir(parents=True, exist_ok=True)
            except OSError as e:
                raise StoreUnavailable(
                    f"cannot create partition folder {Path(SPANS_DIR, path)}: {e.strerror}",
                    retry_after_s=10,
                ) from None
            if len(self._ready) >= _READY_LIMIT:
                self._ready.clear()
            self._ready.add(path)

    def write(
        self, table: pa.Table, tag: PartTag | None = None, skip: frozenset[str] = frozenset()
    ) -> None:
        """Write `table` as one part per partition (named after `tag`), then the manifest.
        `skip`: partition paths ("" unpartitioned) that already hold this tag's part.

        Raises:
            PartialWrite: some partitions failed; their rows are in `unwritten`.
        """
        name = tag.name if tag is not None else None
        failed: list[pa.Table] = []
        errors: list[Exception] = []
        for path, part in self._split(table, skip):
            try:
                # No fsync per file: 1,000 partitions took 5 s in fsyncs; parts are made
                # durable together (make_durable) before the log records they hold go.
                written = self.writer.write(
                    part,
                    partition=path or None,
                    name=name,
                    sync=tag is None,
                    options=SMALL_PART_OPTIONS if part.num_rows < SMALL_PART_ROWS else None,
                )
            except Exception as e:  # noqa: BLE001 - one partition must not cost the others
                failed.append(part)
                errors.append(e)
                continue
            with self._dirs_lock:
                self._unsynced.add(written.parent)
            if self.compactor is not None and tag is not None:
                self.compactor.add(written, tag, part.num_rows)
        self._update_manifest()
        if failed:
            raise PartialWrite(pa.concat_tables(failed), errors[0])

    def _split(self, table: pa.Table, skip: frozenset[str]) -> list[tuple[str, pa.Table]]:
        """(partition path, its rows) to write, in order. One `take` puts the rows in
        partition order and each partition is a slice of it (a take per partition cost
        0.2 s of 1,000)."""
        if not self.partition_by:
            return [] if "" in skip else [("", table)]
        groups = partition_groups(table, self.partition_by)
        paths = [p for p in groups if p not in skip]
        if not paths:
            return []
        ordered = table.take(pa.array(np.concatenate([groups[p] for p in paths])))
        out, at = [], 0
        for p in paths:
            n = len(groups[p])
            out.append((p, ordered.slice(at, n)))
            at += n
        return out

    def make_durable(self) -> None:
        """Make the parts written so far (contents and names) durable, before the log
        records they hold are deleted: one syncfs of the store's filesystem (0.02 s where
        1,000 fsyncs took 5 s), or a sync of every filesystem where there is no syncfs."""
        with self._dirs_lock:
            dirty, self._unsynced = bool(self._unsynced), set()
        if dirty:
            sync_filesystem(self.writer.directory)

    def make_durable_all(self) -> None:
        """Make everything under the store durable (compaction: merged parts, deletions)."""
        with self._dirs_lock:
            self._unsynced = set()
        sync_filesystem(self.writer.directory)

    def _update_manifest(self) -> None:
        try:
            self.writer.write_manifest()
        except OSError as e:
            log.warning("chiptrace: could not update the manifest: %s", e)

    def close(self) -> None:
        pass
