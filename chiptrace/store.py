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
import logging
import os
import re
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

log = logging.getLogger("chiptrace")

SPANS_DIR = "spans"
MANIFEST_DIR = "manifest"
PART_SUFFIX = ".parquet"

# Emulator-like spans repeat names, chips and parents and carry near-sorted times, so
# dictionary + delta encodings with zstd get them well under 32 bytes a span.
# A span id is unique per row, so a dictionary for it only costs: building one and
# falling back to plain took a third of the Parquet write of 1M decorated spans
# (0.35 -> 0.22 us a span) and made the file 4% larger.
_DELTA_COLUMNS = ("start_ns", "end_ns", "op_bytes", "op_flops")
_UNIQUE_COLUMNS = ("span_id",)
SPAN_WRITE_OPTIONS: dict[str, Any] = {
    "compression": "zstd",
    "compression_level": 3,
    "use_dictionary": [
        c for c in SPAN_SCHEMA.names if c not in _DELTA_COLUMNS and c not in _UNIQUE_COLUMNS
    ],
    "column_encoding": {c: "DELTA_BINARY_PACKED" for c in _DELTA_COLUMNS},
    "write_statistics": ["start_ns", "end_ns", "chip_type", "chip_id", "name"],
}


def _host_token(host: str) -> str:
    return host.replace("/", "_").replace(os.sep, "_")


def new_writer_id(host: str | None = None) -> str:
    """`host-pid-nonce`: unique across processes, hosts and pid reuse."""
    return f"{_host_token(host or socket.gethostname())}-{os.getpid()}-{secrets.token_hex(3)}"


def temp_path(path: Path) -> Path:
    """A hidden temporary name beside `path` (readers skip dot files)."""
    return path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")


def commit_temp(tmp: Path, path: Path, sync: bool = True) -> None:
    """fsync a finished temporary file (unless the caller syncs later), then rename it to
    `path` in one step."""
    if sync:
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    os.replace(tmp, path)


def write_atomic(path: Path, write: Any, sync: bool = True) -> None:
    """Call write(tmp_path), fsync, then rename to path: readers see all of it or none."""
    tmp = temp_path(path)
    try:
        write(tmp)
        commit_temp(tmp, path, sync)
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
        remove_stale_temps(self.directory)  # a killed writer's leftovers, never a live one's
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
        try:
            self.write_manifest()
        except OSError as e:  # a full disk at start: one line, not a traceback
            raise StoreError(
                f"cannot write to trace dir {self.directory}: {e.strerror or e}"
            ) from e

    def write(
        self,
        batch: pa.RecordBatch | pa.Table,
        partition: str | None = None,
        name: str | None = None,
        sync: bool = True,
        options: Mapping[str, Any] | None = None,
    ) -> Path:
        """Write one part; returns its path. Thread-safe: threads encode parts at once (the
        encoding releases the GIL); the counters move when a part is in place. `name`: the
        file's name instead of `part-<writer>-<seq>.parquet` (chiptrace collect names parts
        after the log records they hold). `sync=False`: no fsync; the caller makes the
        part durable later (chiptrace collect: one syncfs for all partitions of a flush).
        `options`: pyarrow.parquet.write_table options for this part instead of the
        writer's."""
        table = batch if isinstance(batch, pa.Table) else pa.Table.from_batches([batch])
        with self._lock:
            self._seq += 1
            seq = self._seq
        folder = self.directory / self.table
        if partition:
            folder = folder / partition
            folder.mkdir(parents=True, exist_ok=True)
        path = folder / (name or f"part-{self.writer_id}-{seq:06d}{PART_SUFFIX}")
        opts = self._options if options is None else options
        write_atomic(path, lambda tmp: pq.write_table(table, tmp, **opts), sync)
        with self._lock:
            if self.table == SPANS_DIR:
                self.spans_written += table.num_rows
            self.rows_written += table.num_rows
            self.parts_written += 1
            self.bytes_written += path.stat().st_size
        return path

    def write_manifest(self, **updates: Any) -> None:
        """Replace this writer's manifest atomically with current counts and `updates`.

        Raises:
            OSError: the manifest cannot be written (a full disk, a read-only dir).
        """
        with self._lock:  # the counters and the manifest change together, never half
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

    def close(self, **updates: Any) -> None:
        """Record that this writer has finished (`ended_unix_ns`): a viewer following the
        directory shows the run as ENDED once every writer has."""
        self.write_manifest(ended_unix_ns=time.time_ns(), **updates)


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


def _type_family(t: pa.DataType) -> str:
    """What a reader can rely on of a column's type: dictionary encoding, string width and
    integer width differ between writers (pyarrow, DuckDB, Spark) and all read the same."""
    if pa.types.is_dictionary(t):
        t = t.value_type
    for family, test in (
        ("string", lambda x: pa.types.is_string(x) or pa.types.is_large_string(x)),
        (
            "binary",
            lambda x: (
                pa.types.is_binary(x)
                or pa.types.is_large_binary(x)
                or pa.types.is_fixed_size_binary(x)
            ),
        ),
        ("integer", pa.types.is_integer),
        ("float", pa.types.is_floating),
    ):
        if test(t) or (family == "string" and str(t) == "string_view"):
            return family
    return str(t)


def schema_problem(found: pa.Schema, expected: pa.Schema) -> str | None:
    """Why a part's schema does not fit the table's, or None: a required column missing,
    or a column whose type is of another family (text where integers belong)."""
    names = set(found.names)
    for f in expected:
        if f.name not in names:
            if not f.nullable:
                return f"missing column {f.name!r}"
            continue  # an older part without a newer nullable column reads as nulls
        got = found.field(f.name).type
        if _type_family(got) != _type_family(f.type):
            return f"column {f.name!r} is {got}, expected {f.type}"
    return None


def check_part(path: Path, schema: pa.Schema | None = SPAN_SCHEMA) -> str | None:
    """Return why a part is unusable, or None when its footer, version and schema are good.

    Args:
        path: a Parquet part.
        schema: the table's schema its columns must fit (None: do not check columns).

    Raises:
        SchemaVersionError: the part was written by a newer schema than this chiptrace reads.
    """
    try:
        meta = pq.read_metadata(path)
        arrow = meta.schema.to_arrow_schema()
    except (OSError, pa.ArrowException) as e:
        return str(e).splitlines()[0] if str(e) else type(e).__name__
    kv = meta.metadata or {}
    # Arrow keeps the schema's metadata inside its own serialized schema entry.
    raw = kv.get(SCHEMA_VERSION_KEY) or (arrow.metadata or {}).get(SCHEMA_VERSION_KEY)
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
    if schema is None:
        return None
    return schema_problem(arrow, schema) or _footer_nulls(meta, schema)


def _footer_nulls(meta: pq.FileMetaData, schema: pa.Schema) -> str | None:
    """A required column with NULLs, as the footer's statistics count them (free: no page
    is read; a part without statistics is caught by the content check of verify)."""
    required = {f.name for f in schema if not f.nullable}
    for g in range(meta.num_row_groups):
        group = meta.row_group(g)
        for i in range(group.num_columns):
            col = group.column(i)
            stats = col.statistics
            if col.path_in_schema in required and stats is not None and stats.has_null_count:
                if stats.null_count:
                    return f"column {col.path_in_schema!r} has {stats.null_count} NULLs"
    return None


def part_problem(path: Path, schema: pa.Schema | None = SPAN_SCHEMA) -> str | None:
    """Why a part cannot be read (`check_part`), a newer schema version included: every
    reader skips such a part the same way, with one warning naming it."""
    try:
        return check_part(path, schema)
    except SchemaVersionError as e:
        return str(e).removeprefix(f"{path}: ")


_warned: set[tuple[str, str]] = set()
_warned_lock = threading.Lock()


def warn_skipped(path: Path, reason: str) -> None:
    """Log that a part is skipped: once per part and reason in a process, however many
    readers (a connection, the viewer's feed and its SQL) come across it."""
    key = (str(path), reason)
    with _warned_lock:
        if key in _warned:
            return
        _warned.add(key)
    log.warning("chiptrace: skipping unreadable part %s: %s", path, reason)


def forget_skipped() -> None:
    """Warn again about parts already named (a new command in the same process)."""
    with _warned_lock:
        _warned.clear()


def good_parts(
    dirs: Iterable[Path], table: str = SPANS_DIR, schema: pa.Schema | None = SPAN_SCHEMA
) -> tuple[list[Path], list[tuple[Path, str]]]:
    """Split the parts of `dirs` into usable ones and (bad file, reason) pairs."""
    good: list[Path] = []
    bad: list[tuple[Path, str]] = []
    for d in dirs:
        for part in part_files(d, table):
            reason = part_problem(part, schema)
            (bad.append((part, reason)) if reason else good.append(part))
    return good, bad


def usable_parts(
    directory: Path, table: str = SPANS_DIR, schema: pa.Schema | None = SPAN_SCHEMA
) -> list[Path]:
    """The parts of one trace dir every reader may read; each bad one is skipped with one
    warning naming it. The one gate for the viewer, the export and the analysis."""
    good, bad = good_parts([directory], table, schema)
    for path, reason in bad:
        warn_skipped(path, reason)
    return good


# A part's temporary name while it is written: `.part-HOST-PID-NONCE-SEQ.parquet.HEX.tmp`
# (a manifest's: `.HOST-PID-NONCE.json.HEX.tmp`); see write_atomic and new_writer_id.
_TEMP = re.compile(
    r"^\.(?:part-)?(?P<host>.+)-(?P<pid>\d+)-[0-9a-f]{6}(?:-\d+)*\.\w+\.[0-9a-f]+\.tmp$"
)
STALE_TEMP_S = 3600.0


def writer_gone(host: str, pid: int) -> bool:
    """Whether the writer process `pid` on `host` has exited (False when it cannot tell:
    another host's writer)."""
    if _host_token(host) != _host_token(socket.gethostname()):
        return False  # another host's writer: only its age tells
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:
        return False  # alive, someone else's
    return False


def remove_stale_temps(directory: Path, older_than_s: float = STALE_TEMP_S) -> list[Path]:
    """Delete temporary files a killed writer left behind; returns what was removed.

    A temp file is stale when its writer (host and pid in its name) is gone from this
    host, or when it is older than `older_than_s` (no part takes an hour to write). A live
    writer's file in flight is never touched. A read-only directory is left as it is.
    """
    removed: list[Path] = []
    if not directory.is_dir():
        return removed
    now = time.time()
    for folder in (directory / SPANS_DIR, directory / MANIFEST_DIR, directory / "metrics"):
        if not folder.is_dir():
            continue
        for path in folder.rglob(".*.tmp"):
            m = _TEMP.match(path.name)
            try:
                old = now - path.stat().st_mtime > older_than_s
                if old or (m and writer_gone(m["host"], int(m["pid"]))):
                    path.unlink()
                    removed.append(path)
            except OSError:
                continue
    return removed


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
