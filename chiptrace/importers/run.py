"""One import: read every file, stage, assemble, commit (or remove everything on error)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from chiptrace.importers import ImportSummary
from chiptrace.importers.assemble import Assembler, Pending
from chiptrace.importers.jaeger_context import ContextCopies
from chiptrace.importers.jobs import check_one_job
from chiptrace.importers.plan import FileFacts
from chiptrace.importers.pool import Pool, worker_count
from chiptrace.importers.within import Within
from chiptrace.importers.writer import Staging

TRACE_EVENT_FORMATS = ("kineto", "chrome")


def _reader(path: Path, fmt: str) -> Any:
    if fmt == "kineto":
        from chiptrace.importers.kineto import KinetoReader

        return KinetoReader(str(path))
    from chiptrace.importers.chrome import ChromeReader

    return ChromeReader(str(path))


def _documents(
    path: Path, fmt: str, staging: Staging, context: ContextCopies | None = None
) -> FileFacts:
    """OTLP and Jaeger files carry their own ids: their batches are final as read (but
    Jaeger context copies, which wait for every file: see jaeger_context; a cluster's
    per-file task passes none and stores them as read)."""
    facts = FileFacts(path=str(path), format=fmt)
    if fmt == "otlp-json":
        from chiptrace.importers.otlp import read_otlp

        batches = read_otlp(path, facts)
    else:
        from chiptrace.importers.jaeger import read_jaeger

        batches = read_jaeger(path, facts, context)
    for batch in batches:
        staging.write(batch)
        facts.spans += batch.num_rows
    return facts


def _context_copies(context: ContextCopies, staging: Staging) -> None:
    """Store the Jaeger context copies whose span was in none of the files."""
    from chiptrace.importers.jaeger import batch_of

    for facts, spans in context.finish():
        staging.write(batch_of(spans))
        facts.spans += len(spans)
        facts.categories["span"] = facts.categories.get("span", 0) + len(spans)


def import_manifest(files: list[Path], formats: list[str], align: str) -> dict[str, Any]:
    """The run facts an import records (its own manifest, beside the writers')."""
    return {
        "source": "import",
        "service": "import",
        "import": {"files": [str(f) for f in files], "formats": formats, "align": align},
    }


def run_import(
    files: list[Path],
    formats: list[str],
    out: Path,
    align: str,
    seed: bytes,
    progress: Callable[[int, int], None] | None,
    workers: int | None = None,
    within: Within | None = None,
    merge: bool = False,
) -> ImportSummary:
    manifest = import_manifest(files, formats, align)
    if within is not None:
        manifest.update(service=within.service, **within.manifest)
    staging = Staging(out, manifest)
    sizes = [os.path.getsize(f) for f in files]
    total_bytes = sum(sizes)
    events_bytes = sum(n for n, f in zip(sizes, formats, strict=True) if f == "kineto")
    n_workers = worker_count(workers, events_bytes)
    pool = Pool(n_workers) if n_workers else None
    done_bytes = 0
    try:
        pending: list[Pending] = []
        facts: list[FileFacts] = []
        context = ContextCopies()
        for path, fmt, size in zip(files, formats, sizes, strict=True):
            if fmt not in TRACE_EVENT_FORMATS:
                facts.append(_documents(path, fmt, staging, context))
            else:
                reader = _reader(path, fmt)
                p = _read_events(
                    reader, len(pending), staging, pool, progress, done_bytes, total_bytes
                )
                pending.append(p)
                facts.append(p.facts)
            done_bytes += size
            if progress:
                progress(done_bytes, total_bytes)
        _context_copies(context, staging)
        if pool is not None:
            pool.close()  # the workers' memory goes before the second pass
        if not merge and within is None:
            check_one_job(pending)
        asm = Assembler(staging, seed, align, within)
        asm.finish(pending)
        summary = _summary(out, facts, pending, asm.offsets, n_workers)
        if not summary.spans and within is None:
            staging.abort()  # nothing to store: the dir stays as it was
            return summary
        staging.commit(
            spans_skipped=summary.skipped,
            run_id=within.run_id if within is not None and within.run_id else seed[:8].hex(),
            import_summary={"files": summary.files, "offsets_ns": summary.offsets_ns},
        )
        return summary
    except BaseException:
        if pool is not None:
            pool.close()
        staging.abort()
        raise


def _read_events(
    reader: Any,
    no: int,
    staging: Staging,
    pool: Pool | None,
    progress: Callable[[int, int], None] | None,
    done: int,
    total: int,
) -> Pending:
    pending = Pending(no, reader.facts)
    size = os.path.getsize(reader.facts.path)
    for block in reader.blocks(lambda k: staging.spill_path(no, k), pool):
        pending.blocks.append(block)
        reader.facts.spans += len(block.start)
        if progress:
            # Bytes read are gunzipped bytes: scale them to the file's share of the total.
            frac = min(reader.stream.bytes_read / max(size * 8, 1), 0.95)
            progress(done + int(size * frac), total)
    reader.facts.warnings = list(reader.stream.warnings)
    return pending


def _summary(
    out: Path,
    facts: list[FileFacts],
    pending: list[Pending],
    offsets: dict[int, int],
    workers: int,
) -> ImportSummary:
    summary = ImportSummary(out=str(out), workers=workers)
    summary.files = [_file_summary(f) for f in facts]
    summary.spans = sum(f.spans for f in facts)
    summary.offsets_ns = {p.facts.path: offsets[p.no] for p in pending if offsets.get(p.no)}
    return summary


def _file_summary(f: FileFacts) -> dict[str, Any]:
    out: dict[str, Any] = {"path": f.path, "format": f.format, "spans": f.spans}
    if f.rank is not None:
        out["rank"] = f.rank
    if f.events:
        out["events"] = f.events
    if f.categories:
        out["categories"] = dict(sorted(f.categories.items()))
    if f.format == "kineto":
        from chiptrace.importers.categories import unrecognised

        unknown = unrecognised(f.categories)
        if unknown:  # stored as host work on cpu:0: said, never silent
            out["unrecognised"] = unknown
    if f.warnings:
        out["warnings"] = f.warnings
    out["skipped"] = dict(f.tally.get("skipped", {}))
    for key in ("metadata", "flows"):
        if f.tally.get(key):
            out[key] = f.tally[key]
    return out


# The per-file steps the task plan (chiptrace.importers.tasks) runs as tasks.
reader_for = _reader
documents = _documents
context_copies = _context_copies
summarize = _summary
