"""OTLP JSON files: one ExportTraceServiceRequest (`{"resourceSpans": [...]}`) or JSON Lines
of them (what the OpenTelemetry Collector's file exporter writes), decoded by the collector's
OTLP decoder so that a file and a POST to `chiptrace collect` store the same spans."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa

from chiptrace.importers.plan import FileFacts
from chiptrace.importers.source import TraceFormatError, open_binary, read_some
from chiptrace.schema import chip_type_of

_EXPECTED = 'expected OTLP JSON ({"resourceSpans": [...]}) or JSON Lines of it'


def _documents(path: Path) -> Iterator[tuple[int, bytes]]:
    """(line number, text) of each request: the whole file, or each line of JSON Lines."""
    with open_binary(path) as fh:
        data = b""
        while chunk := read_some(fh, path):
            data += chunk
    lines = [ln for ln in data.splitlines() if ln.strip()]
    if len(lines) > 1 and all(ln.lstrip().startswith(b"{") for ln in lines):
        # One request per line, unless the lines are one pretty-printed document.
        if lines[0].strip() != b"{":
            yield from ((i + 1, ln) for i, ln in enumerate(lines))
            return
    yield 1, data


def _with_chip_types(batch: pa.RecordBatch) -> pa.RecordBatch:
    """chip.type from chip.id where a sender gave only the id."""
    chip, kind = batch.column("chip_id"), batch.column("chip_type")
    if chip.null_count == len(chip) or kind.null_count < len(kind):
        return batch
    types = pa.array([chip_type_of(v) for v in chip.dictionary.to_pylist()], pa.string())
    derived = pa.DictionaryArray.from_arrays(chip.indices, types)
    i = batch.schema.get_field_index("chip_type")
    return batch.set_column(i, batch.schema.field(i), derived)


def read_otlp(path: Path, facts: FileFacts) -> Iterator[pa.RecordBatch]:
    """Span batches of an OTLP JSON or JSONL file; spans with bad ids are skipped, counted.

    Raises:
        TraceFormatError: a document that is not OTLP JSON.
    """
    from chiptrace.collector.decode import DecodeError, decode

    skipped = 0
    for line, text in _documents(path):
        if b'"resourceSpans"' not in text:
            raise TraceFormatError(f"{path}: line {line}: no resourceSpans; {_EXPECTED}")
        try:
            got = decode(text, "application/json")
        except DecodeError as e:
            raise TraceFormatError(f"{path}: line {line}: {e}; {_EXPECTED}") from None
        skipped += got.rejected
        facts.events += got.batch.num_rows + got.rejected
        if got.batch.num_rows:
            yield _with_chip_types(got.batch)
    facts.categories = {"span": facts.events - skipped}
    facts.tally = {"skipped": {"bad span id": skipped} if skipped else {}}
