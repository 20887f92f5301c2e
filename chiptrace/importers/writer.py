"""The importers' way into a trace dir: everything is staged, then committed at once.

An import writes its parts and manifest through the store's `PartWriter` into a hidden
folder inside `--out` (`.import-<nonce>/`; readers look only under `spans/` and
`manifest/`), with per-file spill files for the columns decided in the second pass. Only
when every file has been read and written are the parts renamed into `spans/` and the
manifest into `manifest/`; on any error the folder is removed. So a failed import leaves
nothing in `--out`, and a successful one never shows a half-written part.
"""

from __future__ import annotations

import os
import secrets
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa

from chiptrace.errors import StoreError
from chiptrace.store import MANIFEST_DIR, SPANS_DIR, PartWriter

PART_ROWS = 1 << 19  # spans per Parquet part: big enough for row groups to compress well


class Staging:
    """A hidden folder in `out` that becomes part of the trace dir on `commit()`."""

    def __init__(self, out: str | os.PathLike[str], manifest: dict[str, Any]) -> None:
        self.out = Path(out)
        try:
            self.out.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise StoreError(f"cannot create trace dir {self.out}: {e.strerror}") from e
        self.dir = self.out / f".import-{secrets.token_hex(4)}"
        self.writer = PartWriter(self.dir, manifest=manifest)
        self._pending: list[pa.RecordBatch] = []
        self._pending_rows = 0

    # ------------------------------------------------------------ spill files

    def spill_path(self, n: int) -> Path:
        return self.dir / f"spill-{n:05d}.arrows"

    def spill(self, n: int) -> SpillWriter:
        return SpillWriter(self.spill_path(n))

    def read_spill(self, n: int) -> Iterator[pa.RecordBatch]:
        path = self.spill_path(n)
        if not path.exists():
            return
        with pa.memory_map(str(path)) as src, pa.ipc.open_stream(src) as reader:
            yield from reader
        path.unlink()

    # ------------------------------------------------------------ parts

    def write(self, batch: pa.RecordBatch) -> None:
        """Buffer a finished span batch; write a part each PART_ROWS spans."""
        self._pending.append(batch)
        self._pending_rows += batch.num_rows
        if self._pending_rows >= PART_ROWS:
            self.flush()

    def flush(self) -> None:
        if self._pending_rows:
            self.writer.write(pa.Table.from_batches(self._pending))
        self._pending, self._pending_rows = [], 0

    def commit(self, **manifest: Any) -> None:
        """Move the parts and the manifest into the trace dir; remove the staging folder."""
        self.flush()
        self.writer.write_manifest(**manifest)
        try:
            for sub in (SPANS_DIR, MANIFEST_DIR):
                (self.out / sub).mkdir(exist_ok=True)
                for f in sorted((self.dir / sub).iterdir()):
                    if not f.name.startswith("."):
                        os.replace(f, self.out / sub / f.name)
        except OSError as e:
            raise StoreError(f"cannot move the import into {self.out}: {e.strerror}") from e
        shutil.rmtree(self.dir, ignore_errors=True)

    def abort(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)


class SpillWriter:
    """Batches of one schema (dictionaries may change per batch) to an LZ4 Arrow stream."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._writer: pa.ipc.RecordBatchStreamWriter | None = None

    def write(self, batch: pa.RecordBatch) -> None:
        if self._writer is None:
            opts = pa.ipc.IpcWriteOptions(compression="lz4")
            self._writer = pa.ipc.new_stream(str(self.path), batch.schema, options=opts)
        self._writer.write_batch(batch)

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
