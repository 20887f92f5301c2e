"""The collector's write-ahead log: what a 200 (or gRPC OK) promises survives a SIGKILL.

Every acknowledged batch is first appended to a segment file under `DIR/wal/` and synced
(`fdatasync`); requests arriving together share one sync (group commit: the first to
sync becomes the leader, the others wait for its result). A record is its sequence number,
its length, a CRC32 and the batch as an Arrow IPC stream (as large as its OTLP protobuf,
~30 us to write for 512 spans). Parquet parts are named after the records they hold
(`part-<writer>-<first>-<last>.parquet`, see PartTag), so after a kill the next collector
on the directory (wal_replay) writes exactly the records no part holds. Once parts hold
every record of a segment, the segment is deleted.

One collector writes a directory at a time: the log holds an exclusive `flock` on
`wal/LOCK`, released by the kernel when the process dies however it dies.
"""

from __future__ import annotations

import fcntl
import logging
import os
import struct
import threading
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

from chiptrace.errors import StoreError

log = logging.getLogger("chiptrace")

WAL_DIR = "wal"
SEGMENT_SUFFIX = ".wal"
SEGMENT_BYTES = 32 << 20  # a segment is deleted whole, once parts hold all its records
_MAGIC = b"CTW1"
_HEADER = struct.Struct("<4sIQQ")  # magic, crc32 of the payload, seq, payload length


@dataclass(frozen=True)
class PartTag:
    """The records a part holds: `writer`'s log records `first`..`last`, both included."""

    writer: str
    first: int
    last: int

    @property
    def name(self) -> str:
        """The part's file name (the same in every partition folder it is split into)."""
        return f"part-{self.writer}-{self.first:012d}-{self.last:012d}.parquet"


def encode(batch: pa.RecordBatch) -> memoryview:
    """A batch as the payload of one record (an Arrow IPC stream; no copy into bytes)."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    return memoryview(sink.getvalue())


def decode_payload(payload: bytes) -> pa.RecordBatch:
    return pa.ipc.open_stream(payload).read_next_batch()


def segment_name(writer: str, number: int) -> str:
    return f"{writer}-{number:06d}{SEGMENT_SUFFIX}"


def segment_writer(path: Path) -> str:
    """The writer id in a segment's name."""
    return path.name[: -len(SEGMENT_SUFFIX)].rsplit("-", 1)[0]


def read_segment(path: Path) -> Iterator[tuple[int, bytes]]:
    """(seq, payload) of each whole record; stops at a torn or corrupt tail (a record that
    was never acknowledged: its sync did not return)."""
    with open(path, "rb") as f:
        data = f.read()
    at = 0
    while at + _HEADER.size <= len(data):
        magic, crc, seq, size = _HEADER.unpack_from(data, at)
        end = at + _HEADER.size + size
        if magic != _MAGIC or end > len(data):
            break
        payload = data[at + _HEADER.size : end]
        if zlib.crc32(payload) != crc:
            break
        yield seq, payload
        at = end
    if at < len(data):
        log.warning("chiptrace: %s: %d bytes of an unfinished record ignored", path, len(data) - at)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@dataclass
class _Segment:
    path: Path
    last: int  # the last seq appended to it (0: none yet)


class WriteAheadLog:
    """Append-and-sync log of acknowledged batches for one collector run.

    Args:
        directory: the trace dir (the log lives in its `wal/` folder).
        writer: this run's writer id (part and segment names carry it).
        segment_bytes: a segment is closed and a new one started past this size.

    Raises:
        StoreError: the folder cannot be created, or another collector holds it.
    """

    def __init__(self, directory: Path, writer: str, segment_bytes: int = SEGMENT_BYTES) -> None:
        self.folder = Path(directory) / WAL_DIR
        self.writer = writer
        self.segment_bytes = segment_bytes
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            self._lock_fd = os.open(self.folder / "LOCK", os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            raise StoreError(f"cannot create {self.folder}: {e.strerror}") from e
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(self._lock_fd)
            raise StoreError(
                f"another chiptrace collect is writing {directory} (it holds "
                f"{self.folder / 'LOCK'}); give each collector its own --out"
            ) from None
        self._cond = threading.Condition()
        self._segments: list[_Segment] = []
        self._fd: int | None = None
        self._size = 0
        self._number = 0
        self._next = 1  # the next record's seq
        self._synced = 0  # every record <= this is on disk
        self._inflight: list[tuple[int, int]] = []  # (fd, target) of the syncs in flight
        self._closing_last = 0  # the last record of a segment being closed
        self._lost = 0  # records up to here were in a segment whose final sync failed
        self.released_through = 0  # every record <= this is out of the log (parts hold it)
        self._undeleted = False  # a segment could not be deleted: released_through stops

    # ------------------------------------------------------------ appending

    def append(self, payload: bytes | memoryview) -> int:
        """Write one record (not yet synced); returns its seq. The caller orders appends
        (the spool appends under its lock, so the queue's order is the log's).

        Raises:
            OSError: the record could not be written (nothing of it is kept).
        """
        with self._cond:
            if self._fd is None:
                self._open_segment()
            assert self._fd is not None
            seq = self._next
            header = _HEADER.pack(_MAGIC, zlib.crc32(payload), seq, len(payload))
            record = len(header) + len(payload)
            try:
                wrote = os.writev(self._fd, [header, payload])
                if wrote < record:  # short write (a signal, a nearly full disk): the rest
                    rest = memoryview(header + bytes(payload))[wrote:]
                    while rest:
                        rest = rest[os.write(self._fd, rest) :]
            except OSError:
                self._close_segment(truncate_to=self._size)
                raise
            self._next += 1
            self._size += record
            self._segments[-1].last = seq
            if self._size >= self.segment_bytes:
                self._close_segment()
            return seq

    def sync(self, seq: int) -> None:
        """Return once record `seq` (and all before it) is on disk. A request waits for a
        sync in flight that started after its record was written; otherwise it starts
        one, at once, beside any in flight (the kernel merges concurrent fdatasyncs into
        one disk flush: on this 2-core VM, one sync takes ~4 ms alone, and a second started
        during it ~0.5 ms; waiting for the first to end and then syncing halved the rate
        of 4 senders).

        Raises:
            OSError: the sync failed.
        """
        with self._cond:
            while self._synced < seq:
                if seq <= self._closing_last or any(t >= seq for _, t in self._inflight):
                    self._cond.wait()  # a segment's close, or a sync in flight, covers it
                    continue
                fd, target = self._fd, self._next - 1
                if fd is None or seq <= self._lost:
                    raise OSError(f"the write-ahead log in {self.folder} could not be synced")
                self._inflight.append((fd, target))
                self._cond.release()
                try:
                    os.fdatasync(fd)
                finally:
                    self._cond.acquire()
                    self._inflight.remove((fd, target))
                    self._cond.notify_all()
                self._synced = max(self._synced, target)

    def _open_segment(self) -> None:
        self._number += 1
        path = self.folder / segment_name(self.writer, self._number)
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o644)
        self._size = 0
        self._segments.append(_Segment(path, 0))
        _fsync_dir(self.folder)  # the new name must survive too

    def _close_segment(self, truncate_to: int | None = None) -> None:
        """Sync and close the current segment, first cut to `truncate_to` (after a failed
        write, so no record ever follows a torn one: the reader stops there). A later
        append opens a new segment; syncs of this one's records wait for the close."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        last = self._next - 1
        self._closing_last = max(self._closing_last, last)
        try:
            while any(f == fd for f, _ in self._inflight):
                self._cond.wait()
            if truncate_to is not None:
                try:
                    os.ftruncate(fd, truncate_to)
                except OSError:
                    pass  # the reader stops at the partial record
            try:
                os.fdatasync(fd)
                self._synced = max(self._synced, last)
            except OSError:
                self._lost = max(self._lost, last)  # their sync() raises: answered 503
        finally:
            os.close(fd)
            if self._closing_last == last:
                self._closing_last = 0
            self._cond.notify_all()

    def rotate(self) -> None:
        """Close the current segment (a later append starts the next), so that it can be
        deleted as soon as parts hold its records rather than when it fills."""
        with self._cond:
            self._close_segment()

    # ------------------------------------------------------------ releasing

    def release_through(self, seq: int, before_delete: Callable[[], None]) -> None:
        """Parts now hold every record <= `seq`: delete the segments holding only such
        records. `before_delete` makes those parts durable first (their folders synced).
        """
        with self._cond:
            done = [
                s
                for s in self._segments
                if s.last and s.last <= seq and (s is not self._segments[-1] or self._fd is None)
            ]
        if not done:
            return
        try:
            before_delete()
        except OSError as e:  # kept: the next release (or the next collector) tries again
            log.warning("chiptrace: could not sync the store (%s); keeping its log", e)
            return
        with self._cond:
            self._segments = [s for s in self._segments if s not in done]
        deleted = not self._undeleted
        for s in done:
            try:
                s.path.unlink()
            except OSError as e:
                deleted, self._undeleted = False, True  # its records stay: no longer released
                log.warning("chiptrace: could not delete %s: %s", s.path, e.strerror)
        if deleted:  # segments go in order: every record up to the last one's is gone
            self.released_through = max(self.released_through, max(s.last for s in done))

    def close(self, written_through: int, before_delete: Callable[[], None]) -> None:
        """Close the log; delete every segment whose records parts hold (all of them after a
        clean stop), keep the rest for the next collector. Idempotent."""
        with self._cond:
            self._close_segment()
        self.release_through(written_through, before_delete)
        with self._cond:
            for s in self._segments:
                if not s.last:  # opened, nothing written
                    s.path.unlink(missing_ok=True)
            if self._lock_fd >= 0:
                os.close(self._lock_fd)
                self._lock_fd = -1

    @property
    def last_seq(self) -> int:
        return self._next - 1
