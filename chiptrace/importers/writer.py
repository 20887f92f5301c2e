"""The importers' way into a trace dir: everything is staged, then committed at once.

An import writes its parts and manifest through the store's `PartWriter` into a hidden
folder inside `--out` (`.import-<nonce>/`; readers look only under `spans/` and
`manifest/`), with a spill file per block of events for the columns final after the first pass. Only
when every file has been read and written are the parts renamed into `spans/` and the
manifest into `manifest/`; on any error the folder is removed. So a failed import leaves
nothing in `--out`, and a successful one never shows a half-written part.
"""

from __future__ import annotations

import os
import secrets
import shutil
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pyarrow as pa

from chiptrace.errors import StoreError
from chiptrace.store import MANIFEST_DIR, SPAN_WRITE_OPTIONS, SPANS_DIR, PartWriter

# Spans per Parquet part: big enough for row groups to compress well; a part being built
# and one per writer thread are in memory at once (~35 MB each for Kineto spans).
PART_ROWS = 1 << 17
# The store's span options but zstd level 1 and no dictionary for span and parent ids (all
# distinct: the dictionary is always abandoned): half the CPU, and on a Kineto trace
# slightly smaller files (10.6 MiB for 458k spans, 11.6 with the defaults).
WRITE_OPTIONS = {
    **SPAN_WRITE_OPTIONS,
    "compression_level": 1,
    "use_dictionary": [
        c for c in SPAN_WRITE_OPTIONS["use_dictionary"] if c not in ("span_id", "parent_span_id")
    ],
}
WRITER_THREADS = 2  # parts encoded at once (and the most tables waiting for a thread)


class Staging:
    """A hidden folder in `out` that becomes part of the trace dir on `commit()`.

    Parts are written by background threads (Parquet encoding releases the GIL, so they
    overlap each other and the next batch's assembly); at most WRITER_THREADS tables wait.
    """

    def __init__(
        self,
        out: str | os.PathLike[str],
        manifest: dict[str, Any],
        *,
        writer_id: str | None = None,
        partition: str | None = None,
    ) -> None:
        """`writer_id` names the parts (a cluster task's, so a retry's replace its own);
        `partition`: the hive folder under spans/ every part goes to (`rank=3`)."""
        self.out = Path(out)
        self._made_out = not self.out.exists()
        self.partition = partition
        try:
            self.out.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise StoreError(f"cannot create trace dir {self.out}: {e.strerror}") from e
        self.dir = self.out / f".import-{secrets.token_hex(4)}"
        self.writer = PartWriter(
            self.dir, manifest=manifest, writer_id=writer_id, write_options=WRITE_OPTIONS
        )
        self._pending: list[pa.RecordBatch] = []
        self._pending_rows = 0
        self._thread = ThreadPoolExecutor(WRITER_THREADS, thread_name_prefix="chiptrace-parts")
        self._writes: deque[Future[Any]] = deque()

    # ------------------------------------------------------------ spill files

    def spill_path(self, file_no: int, block_no: int) -> str:
        return str(self.dir / f"spill-{file_no:05d}-{block_no:07d}.arrows")

    # ------------------------------------------------------------ parts

    def write(self, batch: pa.RecordBatch) -> None:
        """Buffer a finished span batch; write a part each PART_ROWS spans."""
        self._pending.append(batch)
        self._pending_rows += batch.num_rows
        if self._pending_rows >= PART_ROWS:
            self.flush()

    def flush(self) -> None:
        if self._pending_rows:
            table = pa.Table.from_batches(self._pending)
            while len(self._writes) >= WRITER_THREADS:
                self._writes.popleft().result()
            self._writes.append(self._thread.submit(self.writer.write, table, self.partition))
        self._pending, self._pending_rows = [], 0

    def _wait(self) -> None:
        while self._writes:
            self._writes.popleft().result()

    def commit(self, **manifest: Any) -> None:
        """Move the parts and the manifest into the trace dir; remove the staging folder."""
        self.flush()
        self._wait()
        self._thread.shutdown()
        self.writer.write_manifest(**manifest)
        try:
            for sub in (SPANS_DIR, MANIFEST_DIR):
                (self.out / sub).mkdir(exist_ok=True)
                for f in sorted((self.dir / sub).rglob("*")):  # hive folders: their files
                    if f.is_file() and not f.name.startswith("."):
                        dest = self.out / sub / f.relative_to(self.dir / sub)
                        dest.parent.mkdir(parents=True, exist_ok=True)
                        os.replace(f, dest)
        except OSError as e:
            raise StoreError(f"cannot move the import into {self.out}: {e.strerror}") from e
        shutil.rmtree(self.dir, ignore_errors=True)

    def abort(self) -> None:
        self._thread.shutdown(wait=True, cancel_futures=True)
        shutil.rmtree(self.dir, ignore_errors=True)
        if self._made_out:  # a dir this import made, left empty: gone too
            try:
                self.out.rmdir()
            except OSError:
                pass


def write_spill(path: str, batch: pa.RecordBatch) -> None:
    """One block's static columns to an uncompressed Arrow file (read back by mapping it)."""
    with pa.OSFile(path, "wb") as sink, pa.ipc.new_stream(sink, batch.schema) as w:
        w.write_batch(batch)


def read_spill(path: str) -> pa.RecordBatch:
    """The batch of a spill file, which is removed (its pages stay mapped while in use)."""
    with pa.memory_map(path) as src, pa.ipc.open_stream(src) as reader:
        batch = reader.read_next_batch()
    os.unlink(path)
    return batch
