"""The writer's side of the recorder: sinks, rows to Arrow, and the buffer's byte count.

Everything here runs where the recorder writes (its writer thread, or an explicit
flush), which is where NumPy and pyarrow load: chiptrace.recorder itself imports neither.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import pyarrow as pa

    from chiptrace.recorder import Recorder
    from chiptrace.store import PartWriter

log = logging.getLogger("chiptrace")

# Buffer bytes a row is counted as (the bound in bytes, CHIPTRACE_MAX_BUFFERED_BYTES): a
# plain row is a tuple of seven ints (~200 bytes with them); a general row adds its
# attributes, events and links, counted by their number and their strings' lengths.
PLAIN_ROW_BYTES = 200
RICH_ROW_BYTES = 600
ITEM_BYTES = 100
SAMPLE = 16


def why(e: BaseException) -> str:
    """An OS error's plain reason ("No space left on device"); pyarrow's own OSErrors
    carry the errno only inside their message."""
    code = getattr(e, "errno", None)
    found = re.search(r"\[errno (\d+)\]", str(e), re.IGNORECASE)
    if code is None and found:
        code = int(found.group(1))
    return os.strerror(code) if code else str(e).splitlines()[0]


class SpanSink(Protocol):
    """Anything that receives finished spans as Arrow batches, on the writer thread."""

    def write(self, batch: pa.RecordBatch) -> None: ...

    def close(self) -> None: ...


class StoreSink:
    """The Parquet store as a sink: one part per flush."""

    takes_tables = True  # a whole flush in one call, no re-batching

    def __init__(self, writer: PartWriter) -> None:
        self.writer = writer

    def write(self, batch: pa.RecordBatch) -> None:
        self.writer.write(batch)

    def close(self) -> None:
        self.writer.close()  # the manifest says the writer has ended (a viewer shows ENDED)


def warm_up(constants: Mapping[str, Any]) -> None:
    """Convert a few rows once now (~0.1 s): the first conversion imports and sets up
    what NumPy and pyarrow need (pa.array imports pandas where installed), and on the
    writer thread that would hold the GIL while the program runs."""
    import pyarrow as pa

    from chiptrace.recording import fastrows as _fastrows
    from chiptrace.recording import sites as _sites
    from chiptrace.schema import NO_TAGS, SPAN_SCHEMA

    site = _sites.site("chiptrace.warm-up", NO_TAGS, 1)
    rows: list[tuple[Any, ...]] = [(site, 1, 1, 1, 0, 1, 2)]
    if site < 0:
        rows = []
    rows.append((NO_TAGS, 1, 1, 2, 1, 1, 2, "w", 1, 0, None, {"a": 1}, None, None))
    try:
        batches, _ = _fastrows.convert(rows, constants)
        pa.Table.from_batches(batches, SPAN_SCHEMA).combine_chunks()
    except Exception:  # noqa: BLE001 - a warm-up failure shows again at the first flush
        log.debug("chiptrace: warm-up conversion failed", exc_info=True)


def convert(
    chunks: list[tuple[Any, ...]], constants: Mapping[str, Any], yielding: bool
) -> tuple[list[pa.RecordBatch], int, Mapping[int, str]]:
    """Rows to batches slice by slice; on the writer thread the GIL goes to the
    program's threads between chunks (see chiptrace.recording.fastrows). Returns the batches, the
    spans a failed conversion cost, and {i: why} for the spans left out for a bad value."""
    from chiptrace.recording import fastrows as _fastrows

    conv = _fastrows.Converter(constants, _fastrows.pause if yielding else None)
    failed = 0
    for i, part in enumerate(chunks):
        # Each chunk is let go as soon as it is converted: freeing a million row tuples at
        # once (the list going out of scope) holds the GIL for ~40 ms in one C call.
        chunks[i] = ()
        try:
            conv.add(part)
        except Exception:  # noqa: BLE001 - a bug in the conversion must not kill the writer
            log.exception("chiptrace: could not convert %d buffered spans; dropped", len(part))
            failed += len(part)
        del part
        if yielding:
            _fastrows.pause()
        if conv.due:
            lost = conv.lost
            try:
                conv.build()
            except Exception:  # noqa: BLE001
                log.exception("chiptrace: could not convert buffered spans; dropped")
                failed += conv.lost - lost
            if yielding:
                _fastrows.pause()
    try:
        out = conv.finish()
    except Exception:  # noqa: BLE001
        log.exception("chiptrace: could not convert buffered spans; dropped")
        failed += conv.lost
        out = conv.batches
    return out, failed, conv.bad


def row_bytes(rows: list[Any]) -> int:
    """Bytes a chunk of rows is counted as (see PLAIN_ROW_BYTES)."""
    plain = list(map(len, rows)).count(7)  # C speed: this runs on the traced thread
    if plain == len(rows):
        return plain * PLAIN_ROW_BYTES
    # General rows: every SAMPLE-th is measured and stands for its neighbours (measuring
    # all would cost ~0.15 us a span, a tenth of a span()'s budget).
    measured = 0
    sampled = rows[::SAMPLE]
    for row in sampled:
        if len(row) != 14:  # plain, or a site row: keys then values after seven ints
            values = row[7 + (len(row) - 7) // 2 :]
            measured += PLAIN_ROW_BYTES + _extent(values)
            continue
        # attributes, events (name, time, attributes), links (trace id, span id,
        # attributes), the name and the status message
        measured += RICH_ROW_BYTES + _extent(row[11:14]) + _extent(row[7]) + _extent(row[10])
    return measured * len(rows) // len(sampled)


def _extent(value: Any) -> int:
    """Bytes a value holds beyond its slot: strings and bytes by their length, sequences and
    mappings by their items (events and links are lists of tuples with a dict inside)."""
    if isinstance(value, (str, bytes)):
        return len(value)
    if isinstance(value, (list, tuple)):
        return sum(ITEM_BYTES + _extent(v) for v in value if v is not None)
    if isinstance(value, dict):
        return sum(ITEM_BYTES + _extent(v) for v in value.values())
    return 0


def emit(rec: Recorder, table: pa.Table) -> None:
    """Hand a flushed table to every sink; a failing sink is counted, logged once, and
    never raises (the first, the store, also counts the table's spans as dropped)."""
    batches: list[pa.RecordBatch] | None = None
    for i, sink in enumerate(rec.sinks):
        try:
            if getattr(sink, "takes_tables", False):
                sink.write(table)
            else:
                if batches is None:
                    batches = table.to_batches(max_chunksize=1 << 20)
                for batch in batches:
                    sink.write(batch)
        except Exception as e:  # noqa: BLE001 - sinks never raise into the traced program
            rec._sink_errors += 1
            if i == 0:
                rec.drop(table.num_rows)
                rec.store_error = rec.store_error or why(e)
            # One line when a sink starts failing (a full disk fails every flush).
            if i not in rec._failing:
                rec._failing.add(i)
                log.warning("chiptrace: sink %s failed: %s", type(sink).__name__, e)
        else:
            rec._failing.discard(i)
