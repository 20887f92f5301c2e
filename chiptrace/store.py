"""The trace store: a directory of Parquet parts plus one manifest per writer.

Layout of a trace directory::

    DIR/
      manifest/<writer>.json          who wrote, when, with what; spans written and dropped
      spans/part-<writer>-<seq>.parquet
      spans/<key>=<value>/.../*.parquet   hive-partitioned output (chiptrace collect)

A writer never rewrites a part: each flush writes a new file under a hidden temporary
name, fsyncs it and renames it into place, so a reader or a crash never sees half a file.
Writer ids carry host and pid, so many processes and hosts share one directory.
"""

from __future__ import annotations

import glob
import json
import os
import secrets
import socket
import sys
import threading
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from chiptrace import _version
from chiptrace.errors import SchemaVersionError, StoreError
from chiptrace.schema import SCHEMA_VERSION, SCHEMA_VERSION_KEY, SPAN_SCHEMA

SPANS_DIR = "spans"
MANIFEST_DIR = "manifest"
PART_SUFFIX = ".parquet"

# Emulator-like spans repeat names, chips and parents and carry near-sorted times, so
# dictionary + delta encodings with zstd get them well under 32 bytes a span.
_DELTA_COLUMNS = ("start_ns", "end_ns", "op_bytes", "op_flops")
SPAN_WRITE_OPTIONS: dict[str, Any] = {
    "compression": "zstd",
    "compression_level": 3,
    "use_dictionary": [c for c in SPAN_SCHEMA.names if c not in _DELTA_COLUMNS],
    "column_encoding": {c: "DELTA_BINARY_PACKED" for c in _DELTA_COLUMNS},
    "write_statistics": ["start_ns", "end_ns", "chip_type", "chip_id", "name"],
}


def new_writer_id(host: str | None = None) -> str:
    """`host-pid-nonce`: unique across processes, hosts and pid reuse."""
    host = (host or socket.gethostname()).replace("/", "_").replace(os.sep, "_")
    return f"{host}-{os.getpid()}-{secrets.token_hex(3)}"


def write_atomic(path: Path, write: Any) -> None:
    """Call write(tmp_path), fsync, then rename to path: readers see all of it or none."""
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    try:
        write(tmp)
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _clock_facts() -> dict[str, Any]:
    raw = os.environ.get("CHIPTRACE_CLOCK_OFFSET_NS", "")
    try:
        offset = int(raw) if raw else 0
    except ValueError:
        offset = 0
    return {
        "wall_unix_ns": time.time_ns(),
        "monotonic_ns": time.monotonic_ns(),
        "offset_ns": offset,
        "offset_source": "CHIPTRACE_CLOCK_OFFSET_NS" if raw else "none",
    }


class PartWriter:
    """Writes span batches as Parquet parts and keeps this writer's manifest current.

    Args:
        directory: the trace directory (created if missing).
        manifest: run facts to record (run id, service, topology, config, ...).
        writer_id: defaults to host-pid-nonce.
        subdir: a partition path under spans/ (for hive-partitioned output).
        table: the folder parts go under: `spans` (default) or another table such as
            `metrics` (host samples); a non-span writer counts `rows_written` instead.
        write_options: pyarrow.parquet.write_table options for a non-span table, or for
            spans whose shape differs from recorded ones (imported traces).
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        manifest: Mapping[str, Any] | None = None,
        writer_id: str | None = None,
        *,
        table: str = SPANS_DIR,
        write_options: Mapping[str, Any] | None = None,
    ) -> None:
        self.directory = Path(directory)
        self.writer_id = writer_id or new_writer_id()
        self.table = table
        self._options = dict(write_options) if write_options is not None else SPAN_WRITE_OPTIONS
        self._seq = 0
        self._lock = threading.Lock()
        self.spans_written = 0
        self.rows_written = 0
        self.parts_written = 0
        self.bytes_written = 0
        try:
            (self.directory / table).mkdir(parents=True, exist_ok=True)
            (self.directory / MANIFEST_DIR).mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise StoreError(f"cannot create trace dir {self.directory}: {e.strerror}") from e
        self.manifest: dict[str, Any] = {
            "writer_id": self.writer_id,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "started_unix_ns": time.time_ns(),
            # Spans carry this host's wall clock. A launcher that knows the host's offset
            # from a reference clock (chrony, PTP) passes it, so readers can align hosts.
            "clock": _clock_facts(),
            "chiptrace_version": _version.__version__,
            "schema_version": SCHEMA_VERSION,
            "python": sys.version.split()[0],
            "argv": list(sys.argv),
            **(manifest or {}),
        }
        self.write_manifest()

    def write(self, batch: pa.RecordBatch | pa.Table, partition: str | None = None) -> Path:
        """Write one part; returns its path. Thread-safe: threads encode parts at once (the
        encoding releases the GIL); the counters move when a part is in place."""
        table = batch if isinstance(batch, pa.Table) else pa.Table.from_batches([batch])
        with self._lock:
            self._seq += 1
            seq = self._seq
        folder = self.directory / self.table
        if partition:
            folder = folder / partition
            folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"part-{self.writer_id}-{seq:06d}{PART_SUFFIX}"
        write_atomic(path, lambda tmp: pq.write_table(table, tmp, **self._options))
        with self._lock:
            if self.table == SPANS_DIR:
                self.spans_written += table.num_rows
            self.rows_written += table.num_rows
            self.parts_written += 1
            self.bytes_written += path.stat().st_size
        return path

    def write_manifest(self, **updates: Any) -> None:
        """Replace this writer's manifest atomically with current counts and `updates`."""
        self.manifest.update(updates)
        self.manifest.update(
            spans_written=self.spans_written,
            parts_written=self.parts_written,
            bytes_written=self.bytes_written,
            updated_unix_ns=time.time_ns(),
        )
        if self.table != SPANS_DIR:
            self.manifest.update(table=self.table, rows_written=self.rows_written)
        path = self.directory / MANIFEST_DIR / f"{self.writer_id}.json"
        text = json.dumps(self.manifest, indent=1, default=str)
        write_atomic(path, lambda tmp: tmp.write_text(text))


# ---------------------------------------------------------------- reading


def expand_dirs(paths: Iterable[str | os.PathLike[str]]) -> list[Path]:
    """Expand globs and check each trace dir exists.

    Raises:
        StoreError: a path or glob that matches nothing.
    """
    dirs: list[Path] = []
    for raw in paths:
        text = os.fspath(raw)
        matches = sorted(glob.glob(text)) if glob.has_magic(text) else [text]
        if not matches:
            raise StoreError(f"no trace dir matches {text!r}")
        for m in matches:
            p = Path(m)
            if not p.exists():
                raise StoreError(f"trace dir {str(p)!r} does not exist")
            if p.is_dir() or p.suffix == PART_SUFFIX:
                dirs.append(p)
    if not dirs:
        raise StoreError("no trace dir given")
    return dirs


def part_files(directory: Path, table: str = SPANS_DIR) -> list[Path]:
    """Every complete part of `table` under a trace dir (temporary files excluded)."""
    if directory.is_file():
        return [directory]
    root = directory / table
    if not root.is_dir():
        return []
    return sorted(p for p in root.rglob(f"*{PART_SUFFIX}") if not p.name.startswith("."))


def check_part(path: Path) -> str | None:
    """Return why a part is unreadable, or None when its footer and version are good.

    Raises:
        SchemaVersionError: the part was written by a newer schema than this chiptrace reads.
    """
    try:
        meta = pq.read_metadata(path)
    except (OSError, pa.ArrowException) as e:
        return str(e).splitlines()[0] if str(e) else type(e).__name__
    kv = meta.metadata or {}
    raw = kv.get(SCHEMA_VERSION_KEY)
    if raw is None:
        # Arrow keeps the schema's metadata inside its own serialized schema entry.
        try:
            raw = meta.schema.to_arrow_schema().metadata.get(SCHEMA_VERSION_KEY)
        except Exception:  # noqa: BLE001 - a part without arrow metadata is still readable
            raw = None
    if raw is not None:
        try:
            version = int(raw)
        except ValueError:
            return f"bad schema version {raw!r}"
        if version > SCHEMA_VERSION:
            raise SchemaVersionError(
                f"{path}: schema version {version} is newer than this chiptrace reads "
                f"({SCHEMA_VERSION}); upgrade chiptrace"
            )
    return None


def good_parts(
    dirs: Iterable[Path], table: str = SPANS_DIR
) -> tuple[list[Path], list[tuple[Path, str]]]:
    """Split the parts of `dirs` into readable ones and (bad file, reason) pairs."""
    good: list[Path] = []
    bad: list[tuple[Path, str]] = []
    for d in dirs:
        for part in part_files(d, table):
            reason = check_part(part)
            (bad.append((part, reason)) if reason else good.append(part))
    return good, bad


def read_manifests(dirs: Iterable[Path]) -> list[dict[str, Any]]:
    """Every writer manifest under `dirs`, with `trace_dir` added; unreadable ones skipped."""
    out: list[dict[str, Any]] = []
    for d in dirs:
        folder = d / MANIFEST_DIR if d.is_dir() else d.parent.parent / MANIFEST_DIR
        for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
            try:
                data = json.loads(path.read_text())
            except (OSError, ValueError):
                continue
            if isinstance(data, dict):
                data["trace_dir"] = str(d)
                out.append(data)
    return out
