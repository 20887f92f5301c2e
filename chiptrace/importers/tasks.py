"""An import as independent tasks over shared storage, for a cluster (chiptrace.cluster).

The plan is run_import's, cut where it already divides: pass 1 reads each file into blocks
(`read_file`: static columns spilled, the tree's numbers kept), the client decides what
needs every file from their facts (clock offsets and rank prefixes: `assemble.align_offsets`,
`assemble.qualifier`), pass 2 builds each file's tree and writes its parts (`write_file`,
the Assembler's own per-file step). Here pass 1 also saves its blocks' numbers beside the
spills, so pass 2 may run on another worker, and every task's output is a folder of its
own inside the import's staging folder (`<out>/.import-<nonce>/`).

A big Kineto file (pool.MIN_POOL_BYTES or more) is also cut in slices on a cluster: its
reading task cuts the blocks and the cluster decodes and maps them, each a task of its own
(pool.Pool's plan, with Dask's futures for the process pool's); in process, the blocks go
to pool.Pool itself, as run_import's do.

Retries lose and double nothing: a task writes into `<task>.tmp-<nonce>` and renames it to
`<task>` only once complete, replacing what an earlier try of the same task left there;
pass 2 links the spills it consumes instead of taking them, so it can run again; the
client moves only the parts of finished `write-*` folders, once, at the commit. A worker
killed mid-task leaves a `.tmp-` folder that the commit removes with the staging folder.
"""

from __future__ import annotations

import os
import pickle
import secrets
import shutil
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from chiptrace.importers import ImportSummary
from chiptrace.importers.assemble import Assembler, Pending, align_offsets, qualifier
from chiptrace.importers.detect import detect
from chiptrace.importers.jaeger_context import ContextCopies
from chiptrace.importers.jobs import check_files, first_ns
from chiptrace.importers.plan import Block, FileFacts
from chiptrace.importers.pool import Pool, worker_count
from chiptrace.importers.run import (
    TRACE_EVENT_FORMATS,
    context_copies,
    documents,
    import_manifest,
    reader_for,
    summarize,
)
from chiptrace.importers.writer import Staging
from chiptrace.store import PART_SUFFIX, SPANS_DIR

_BLOCKS = "blocks.pickle"
_DOCUMENTS = ("otlp-json", "jaeger-json")  # carry their ids: final as read, no pass 2
# Jaeger files are read together, in one task (`read_jaeger_files`): a context copy is
# stored only where its span is in none of the files (jaeger_context), as in process.
_JAEGER = "jaeger-json"


@dataclass
class ReadResult:
    """What pass 1 sends back to the client: the file's facts (small: no span columns)."""

    no: int
    facts: FileFacts
    done: bool  # OTLP / Jaeger: the parts are written already, there is no pass 2
    first_ns: int | None = None  # the first span's start (jobs.first_ns), for --merge's check
    jaeger: bool = False  # detected as Jaeger: nothing read, left to read_jaeger_files


def task_dir(staging: Path, kind: str, no: int) -> Path:
    return staging / f"{kind}-{no:05d}"


def _fresh(final: Path) -> Path:
    tmp = final.with_name(f"{final.name}.tmp-{secrets.token_hex(4)}")
    tmp.mkdir()  # not parents: a task left running after an abort must not recreate staging
    return tmp


def _publish(tmp: Path, final: Path) -> None:
    """Rename a finished task folder into place, replacing an earlier try's."""
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)


def rank_partition(facts: FileFacts, no: int) -> str:
    """The hive folder of a file's parts under `--partition-by rank`."""
    return f"rank={facts.rank if facts.rank is not None else no}"


def _parts_staging(tmp: Path, writer_id: str, partition: str | None) -> Staging:
    return Staging(tmp, {"source": "import"}, writer_id=writer_id, partition=partition)


def read_file(
    path: str, fmt: str, no: int, staging: str, writer_id: str, blocks_on: Any = None
) -> ReadResult:
    """Pass 1 of one file (`fmt` auto: detected here): its blocks spilled into
    `<staging>/read-NNNNN/`.

    OTLP and Jaeger files carry their ids, so their parts are final as read: they go to
    `<staging>/write-NNNNN/` at once. `blocks_on`: for a big Kineto file, a context
    manager giving pool.Pool's interface (chiptrace.cluster's block tasks): this task
    reads and cuts the file, the pool's tasks decode and map its blocks.
    """
    root = Path(staging)
    if fmt == "auto":
        fmt = detect(path)
    if fmt == _JAEGER:
        return ReadResult(no, FileFacts(path=path, format=fmt), False, jaeger=True)
    if fmt not in TRACE_EVENT_FORMATS:
        final = task_dir(root, "write", no)
        tmp = _fresh(final)
        parts = _parts_staging(tmp, f"{writer_id}-f{no:05d}", None)
        try:
            facts = documents(Path(path), fmt, parts)
            parts.commit()
        except BaseException:
            parts.abort()
            raise
        _publish(tmp, final)
        return ReadResult(no, facts, True)
    final = task_dir(root, "read", no)
    tmp = _fresh(final)
    reader = reader_for(Path(path), fmt)
    blocks: list[Block] = []
    pooled = blocks_on if blocks_on is not None and fmt == "kineto" else nullcontext()
    with pooled as pool:
        for block in reader.blocks(lambda k: str(tmp / f"spill-{k:07d}.arrows"), pool):
            block.spill = None if block.spill is None else Path(block.spill).name
            blocks.append(block)
            reader.facts.spans += len(block.start)
    reader.facts.warnings = list(reader.stream.warnings)
    with open(tmp / _BLOCKS, "wb") as fh:
        pickle.dump(blocks, fh, protocol=5)
    _publish(tmp, final)
    first = first_ns(Pending(no, reader.facts, blocks))
    return ReadResult(no, reader.facts, False, first)


def read_jaeger_files(
    paths: list[str], nos: list[int], staging: str, writer_id: str
) -> list[ReadResult]:
    """Every Jaeger file of the import, in one task: their parts into the first one's
    `<staging>/write-NNNNN/`, the context copies whose span is in none of them last (the
    in-process import's ContextCopies, which needs every file)."""
    final = task_dir(Path(staging), "write", nos[0])
    tmp = _fresh(final)
    parts = _parts_staging(tmp, f"{writer_id}-f{nos[0]:05d}", None)
    context = ContextCopies()
    try:
        facts = [documents(Path(p), _JAEGER, parts, context) for p in paths]
        context_copies(context, parts)
        parts.commit()
    except BaseException:
        parts.abort()
        raise
    _publish(tmp, final)
    return [ReadResult(no, f, True) for no, f in zip(nos, facts, strict=True)]


def write_file(
    staging: str,
    no: int,
    facts: FileFacts,
    offset: int,
    prefix: str,
    seed: bytes,
    align: str,
    writer_id: str,
    partition_by: str | None,
) -> int:
    """Pass 2 of one file: its tree, ids and parts into `<staging>/write-NNNNN/`; returns
    the spans written. `offset` and `prefix` are the client's decisions over every file."""
    root = Path(staging)
    src = task_dir(root, "read", no)
    with open(src / _BLOCKS, "rb") as fh:
        blocks: list[Block] = pickle.load(fh)
    final = task_dir(root, "write", no)
    tmp = _fresh(final)
    for b in blocks:
        if b.spill is not None:  # a link: Assembler consumes (unlinks) it, a retry has its own
            os.link(src / b.spill, tmp / b.spill)
            b.spill = str(tmp / b.spill)
    partition = rank_partition(facts, no) if partition_by == "rank" else None
    parts = _parts_staging(tmp, f"{writer_id}-f{no:05d}", partition)
    try:
        asm = Assembler(parts, seed, align)
        asm.offsets = {no: offset}
        n = asm.write_file(Pending(no, facts, blocks), prefix)
        parts.commit()
    except BaseException:
        parts.abort()
        raise
    for spill in tmp.glob("spill-*"):
        spill.unlink()
    _publish(tmp, final)
    return n


def gather_parts(staging: Path, files: int) -> int:
    """Move every finished write task's parts into the staging folder's own `spans/`
    (keeping hive folders), for Staging.commit; returns the number of parts."""
    moved = 0
    for no in range(files):
        spans = task_dir(staging, "write", no) / SPANS_DIR
        for part in sorted(spans.rglob(f"*{PART_SUFFIX}")):
            if part.name.startswith("."):
                continue
            dest = staging / SPANS_DIR / part.relative_to(spans)
            dest.parent.mkdir(parents=True, exist_ok=True)
            os.replace(part, dest)
            moved += 1
    return moved


# ---------------------------------------------------------------- the plan, on an executor


class Executor(Protocol):
    """Where tasks run: chiptrace.cluster's Dask client, or `InProcess`."""

    def submit(self, key: str, fn: Callable[..., Any], *args: Any) -> Any: ...

    def as_completed(self, futures: list[Any]) -> Iterator[Any]: ...

    def cancel(self, futures: list[Any]) -> None: ...

    def block_pool(self, size: int) -> Any:
        """What read_file's `blocks_on` gets for a file of `size` bytes (None: its task
        maps its blocks itself)."""
        ...


class InProcess:
    """Runs each task as it is submitted, here (`--partition-by` without a cluster); a big
    Kineto file's blocks go to the import's process pool (pool.Pool), as run_import's do."""

    def __init__(self, workers: int | None = None) -> None:
        self.requested = workers
        self.workers = 0

    def submit(self, key: str, fn: Callable[..., Any], *args: Any) -> Future[Any]:
        fut: Future[Any] = Future()
        try:
            fut.set_result(fn(*args))
        except BaseException as e:  # handed back through result(), as a pool would
            fut.set_exception(e)
        return fut

    def as_completed(self, futures: list[Any]) -> Iterator[Any]:
        return iter(futures)

    def cancel(self, futures: list[Any]) -> None:
        pass

    def block_pool(self, size: int) -> Any:
        n = worker_count(self.requested, size)  # as run_import decides
        self.workers = max(self.workers, n)
        return _PoolBlocks(n) if n else None


class _PoolBlocks:
    """pool.Pool as read_file's `blocks_on`: forked on entering, closed on leaving."""

    def __init__(self, workers: int) -> None:
        self.workers = workers
        self._pool: Pool | None = None

    def __enter__(self) -> Pool:
        self._pool = Pool(self.workers)
        return self._pool

    def __exit__(self, *exc: object) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool = None


@dataclass
class Progress:
    """How far a task import is: files fully written, tasks done, spans written."""

    files_done: int
    files: int
    tasks_done: int
    tasks: int
    spans: int
    seconds: float


def run_tasks(
    files: list[Path],
    formats: list[str],
    out: Path,
    align: str,
    seed: bytes,
    executor: Executor,
    progress: Callable[[Progress], None] | None = None,
    partition_by: str | None = None,
    merge: bool = False,
) -> ImportSummary:
    """run_import's plan as tasks: read every file, decide offsets and prefixes here,
    write every file; then commit the parts at once (or remove everything on error).
    Files that look like different jobs are refused unless `merge` (jobs.check_files)."""
    run = _TaskImport(files, formats, out, executor, progress, align)
    try:
        results = run.read_all()
        facts = [results[no].facts for no in range(len(files))]
        for f, path in zip(facts, files, strict=True):
            f.path = str(path)  # as given, as run_import reports it
        read = [r for _, r in sorted(results.items()) if not r.done]
        if not merge:
            check_files([(r.facts, r.first_ns) for r in read])
        pending = [Pending(r.no, r.facts) for r in read]
        offsets = align_offsets(pending, align)
        prefixes = qualifier(pending)
        run.write_all(
            (p.no, p.facts, offsets[p.no], prefixes[p.no], seed, align, run.wid, partition_by)
            for p in pending
        )
        gather_parts(run.staging.dir, len(files))
        summary = summarize(out, facts, pending, offsets, getattr(executor, "workers", 0))
        run.staging.writer.spans_written = summary.spans  # the tasks wrote them, not it
        run.staging.commit(
            # the formats found (the read tasks detected those given as auto)
            **import_manifest(files, [f.format for f in facts], align),
            spans_skipped=summary.skipped,
            run_id=seed[:8].hex(),
            import_summary={"files": summary.files, "offsets_ns": summary.offsets_ns},
        )
        return summary
    except BaseException:
        executor.cancel(run.futures)
        run.staging.abort()
        raise


class _TaskImport:
    """One task import's staging folder, its tasks out, and its progress."""

    def __init__(
        self,
        files: list[Path],
        formats: list[str],
        out: Path,
        executor: Executor,
        progress: Callable[[Progress], None] | None,
        align: str,
    ) -> None:
        from chiptrace.importers.writer import Staging

        self.staging = Staging(out, import_manifest(files, formats, align))
        self.files = [f.resolve() for f in files]  # a worker's working folder is not ours
        self.formats = formats
        self.executor = executor
        self.wid = self.staging.dir.name.removeprefix(".import-")
        self.root = str(self.staging.dir.resolve())
        tasks = sum(1 if f in _DOCUMENTS else 2 for f in formats if f != _JAEGER)
        tasks += int(_JAEGER in formats)  # one task reads every Jaeger file
        self.state = Progress(0, len(files), 0, tasks, 0, 0.0)
        self.progress = progress
        self.futures: list[Any] = []
        self._t0 = time.perf_counter()

    def _tick(self, files_done: int, spans: int) -> None:
        st = self.state
        st.tasks_done += 1
        st.files_done += files_done
        st.spans += spans
        st.seconds = time.perf_counter() - self._t0
        if self.progress:
            self.progress(st)

    def read_all(self) -> dict[int, ReadResult]:
        """Pass 1: a task per file (a big Kineto file's blocks: tasks of their own too),
        then one for every Jaeger file (given so, or found so by its file's task)."""
        results = self._read_each()
        jaeger = sorted(no for no, r in results.items() if r.jaeger)
        jaeger += [no for no, f in enumerate(self.formats) if f == _JAEGER]
        if not jaeger:
            return results
        if _JAEGER not in self.formats:
            self.state.tasks += 1
        self.futures = [
            self.executor.submit(
                f"chiptrace-jaeger-{self.wid}",
                read_jaeger_files,
                [str(self.files[no]) for no in sorted(jaeger)],
                sorted(jaeger),
                self.root,
                self.wid,
            )
        ]
        (fut,) = self.executor.as_completed(self.futures)
        for r in fut.result():
            results[r.no] = r
        self._tick(len(jaeger), sum(results[no].facts.spans for no in jaeger))
        return results

    def _read_each(self) -> dict[int, ReadResult]:
        self.futures = [
            self.executor.submit(
                f"chiptrace-read-{self.wid}-{no}",
                read_file,
                str(p),
                fmt,
                no,
                self.root,
                self.wid,
                self.executor.block_pool(os.path.getsize(p)) if fmt in ("kineto", "auto") else None,
            )
            for no, (p, fmt) in enumerate(zip(self.files, self.formats, strict=True))
            if fmt != _JAEGER
        ]
        results: dict[int, ReadResult] = {}
        for fut in self.executor.as_completed(self.futures):
            r = fut.result()
            results[r.no] = r
            if (r.done or r.jaeger) and self.formats[r.no] not in _DOCUMENTS:
                self.state.tasks -= 1  # detected as OTLP / Jaeger: no pass 2
            self._tick(int(r.done), r.facts.spans if r.done else 0)
        return results

    def write_all(self, calls: Iterable[tuple[Any, ...]]) -> None:
        """Pass 2: a task per Trace Event file, `write_file(staging, *call)`."""
        self.futures = [
            self.executor.submit(f"chiptrace-write-{self.wid}-{c[0]}", write_file, self.root, *c)
            for c in calls
        ]
        for fut in self.executor.as_completed(self.futures):
            self._tick(1, fut.result())
