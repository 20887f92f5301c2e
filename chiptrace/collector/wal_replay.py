"""Recovery: what a killed collector acknowledged and did not write, stored exactly once.

A collector's log records are numbered, and every part it writes is named after the records
it holds (wal.PartTag), in each partition folder it is split into. Replaying the log of a
writer that is gone (its segments are still in `wal/`, and no live collector holds the
lock) therefore needs no guess:

- a record in no part's range is written now, in parts named after the records they hold;
- a range whose parts exist is complete unless the collector died while writing it: its
  records are split by partition again (the split depends only on the rows) and only the
  partition folders without that part are written;
- a range whose first record is no longer in the log was complete (a segment is deleted
  only once parts hold all its records), so its records still in the log are skipped.

A replay killed half-way leaves parts named the same way, so the next one finishes it. Only
then are the segments deleted.
"""

from __future__ import annotations

import json
import logging
import re
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa

from chiptrace.collector.sink import PartitionedStoreSink
from chiptrace.collector.wal import (
    SEGMENT_SUFFIX,
    WAL_DIR,
    PartTag,
    decode_payload,
    read_segment,
    segment_writer,
)
from chiptrace.store import MANIFEST_DIR, SPANS_DIR, PartWriter, check_part

log = logging.getLogger("chiptrace")

_TAGGED = re.compile(r"^part-(?P<writer>.+)-(?P<first>\d{12})-(?P<last>\d{12})\.parquet$")


def _written_ranges(
    directory: Path, writers: set[str]
) -> dict[str, dict[tuple[int, int], set[str]]]:
    """writer -> (first, last) -> partition paths ("" for flat) holding that range's part,
    for the writers whose logs are being replayed. A part that does not read (parts are
    synced in a batch before their records leave the log, so a power loss can leave one
    empty while its records are still here) is deleted: its records are written again."""
    found: dict[str, dict[tuple[int, int], set[str]]] = defaultdict(lambda: defaultdict(set))
    root = directory / SPANS_DIR
    if not root.is_dir():
        return found
    for path in root.rglob("part-*.parquet"):
        m = _TAGGED.match(path.name)
        if not m or m["writer"] not in writers:
            continue
        if check_part(path, schema=None) is not None:
            log.warning("chiptrace: %s does not read; writing its spans again from the log", path)
            path.unlink()
            continue
        rel = path.parent.relative_to(root).as_posix()
        ranges = found[m["writer"]]
        ranges[(int(m["first"]), int(m["last"]))].add("" if rel == "." else rel)
    return found


def _records(segments: list[Path]) -> Iterator[tuple[int, bytes]]:
    for seg in sorted(segments):
        yield from read_segment(seg)


def _chunks(
    records: Iterator[tuple[int, bytes]],
    ranges: dict[tuple[int, int], set[str]],
    max_spans: int,
) -> Iterator[tuple[int, int, list[pa.RecordBatch], frozenset[str]]]:
    """(first, last, batches, partition paths that already hold them) to write."""
    covered = sorted(ranges)  # a handful: the parts a killed run wrote since its last delete
    pending: list[tuple[int, pa.RecordBatch]] = []
    current: tuple[int, int] | None = None  # an existing range being gathered again

    def finish() -> tuple[int, int, list[pa.RecordBatch], frozenset[str]]:
        first, last = current or (pending[0][0], pending[-1][0])
        return first, last, [b for _, b in pending], frozenset(ranges.get((first, last), ()))

    for seq, payload in records:
        if current is not None and seq > current[1]:
            yield finish()
            pending, current = [], None
        if current is None:
            where = next(((f, la) for f, la in covered if f <= seq <= la), None)
            if where is not None and where[0] != seq:
                continue  # the range's first record is gone, so the range was complete
            if where is not None:
                if pending:
                    yield finish()
                    pending = []
                current = where
        pending.append((seq, decode_payload(payload)))
        if current is None and sum(b.num_rows for _, b in pending) >= max_spans:
            yield finish()
            pending = []
    if pending:
        yield finish()


def _partition_by(directory: Path, writer: str, default: tuple[str, ...]) -> tuple[str, ...]:
    """The partition keys the log's writer split its parts by (its manifest says), so the
    replay finds and completes its parts even when this collector partitions otherwise."""
    try:
        manifest = json.loads((directory / MANIFEST_DIR / f"{writer}.json").read_text())
        return tuple(manifest["partition_by"])
    except (OSError, ValueError, KeyError, TypeError):
        return default


def replay(
    directory: Path,
    writer: PartWriter,
    partition_by: tuple[str, ...] = (),
    max_spans: int = 200_000,
) -> int:
    """Store what the logs in `directory/wal` hold and no part does, with `writer`; delete
    the logs. Returns the spans written. The caller holds the log's lock (WriteAheadLog).

    Raises:
        OSError, pyarrow errors: a part could not be written (the logs are kept).
    """
    folder = directory / WAL_DIR
    segments: dict[str, list[Path]] = defaultdict(list)
    for seg in folder.glob(f"*{SEGMENT_SUFFIX}"):
        segments[segment_writer(seg)].append(seg)
    if not segments:
        return 0
    written = _written_ranges(directory, set(segments))
    total = 0
    for dead, segs in sorted(segments.items()):
        sink = PartitionedStoreSink(writer, _partition_by(directory, dead, partition_by))
        for first, last, batches, skip in _chunks(_records(segs), written[dead], max_spans):
            table = pa.Table.from_batches(batches).combine_chunks()
            before = writer.spans_written
            sink.write(table, PartTag(dead, first, last), skip=skip)
            total += writer.spans_written - before
        sink.make_durable()
        sink.close()
    for segs in segments.values():
        for seg in segs:
            seg.unlink()
    if total:
        log.warning(
            "chiptrace: stored %d spans a stopped collector had acknowledged and not written "
            "(from its write-ahead log in %s)",
            total,
            folder,
        )
    return total
