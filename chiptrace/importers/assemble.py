"""Second pass over Trace Event files: clocks, chip names, ids, and the finished batches.

Runs once every file has been read, because three decisions need all of them: the clock
offset of each rank (aligned on the ends of its collectives), whether chip ids must be
qualified by rank (two ranks both have a `gpu:0`), and the trace id of each step (shared by
all ranks). Memory: the in-memory numbers of the files plus one spilled batch at a time.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from chiptrace.importers import arrow, tree
from chiptrace.importers.plan import Block, FileFacts, concat
from chiptrace.importers.within import Within
from chiptrace.importers.writer import Staging, read_spill
from chiptrace.schema import SPAN_SCHEMA, dumps, ids_to_binary, trace_ids_to_binary

_US = 1000


@dataclass
class _Ids:
    span: np.ndarray  # uint64
    parent: np.ndarray  # uint64, 0 for none
    trace: np.ndarray  # index into Assembler._traces
    given_trace: pa.Array | None = None  # the file's own trace ids, where it has them


def fixed_binary(rows: np.ndarray) -> pa.FixedSizeBinaryArray:
    """A fixed_size_binary[w] array from an (n, w) uint8 matrix."""
    n, w = rows.shape
    data = pa.py_buffer(np.ascontiguousarray(rows))
    return pa.FixedSizeBinaryArray.from_buffers(pa.binary(w), n, [None, data])


@dataclass
class Pending:
    """One read file: its facts and its in-memory columns (blocks concatenated)."""

    no: int
    facts: FileFacts
    blocks: list[Block] = field(default_factory=list)
    ids: bool = False  # the file carried its own span ids (chiptrace's Chrome export)

    def take(self, name: str) -> np.ndarray:
        """One in-memory column of the whole file; the blocks let go of their pieces."""
        out = concat(self.blocks, name)
        for b in self.blocks:
            setattr(b, name, None)
        return out


def align_offsets(files: list[Pending], mode: str) -> dict[int, int]:
    """ns to add to each file's clock so ranks agree: the median gap between the ends of
    their k-th collectives (a collective ends on all ranks at once), rounded to whole µs.

    Args:
        mode: `nccl`, `none`, or `auto` (nccl when two or more files have NCCL kernels).
    """
    with_nccl = [f for f in files if len(f.facts.nccl_ends)]
    if mode == "none" or len(with_nccl) < 2 or (mode == "auto" and len(with_nccl) < 2):
        return {f.no: 0 for f in files}
    ref = min(
        with_nccl, key=lambda f: (f.facts.rank if f.facts.rank is not None else 1 << 30, f.no)
    )
    ref_ends = np.sort(ref.facts.nccl_ends) + ref.facts.base_ns
    out = {f.no: 0 for f in files}
    for f in with_nccl:
        if f is ref:
            continue
        ends = np.sort(f.facts.nccl_ends) + f.facts.base_ns
        k = min(len(ends), len(ref_ends))
        gap = int(np.median(ref_ends[:k] - ends[:k]))
        out[f.no] = int(round(gap / _US)) * _US
    return out


def qualifier(files: list[Pending]) -> dict[int, str]:
    """Chip-id prefix per file: `rankR/` when the import holds several ranks, else none."""
    many = len(files) > 1 or any((f.facts.world_size or 0) > 1 for f in files)
    if not many:
        return {f.no: "" for f in files}
    ranks = [f.facts.rank for f in files]
    unique = None not in ranks and len(set(ranks)) == len(ranks)
    return {f.no: f"rank{f.facts.rank if unique else f.no}/" for f in files}


def _prefixed(arr: pa.Array, fn: Any) -> pa.Array:
    if arr.null_count == len(arr):
        return arr
    values = [fn(v) for v in arr.dictionary.to_pylist()]
    return pa.DictionaryArray.from_arrays(arr.indices, arrow.strings(values))


def _qualify_link(link: str, prefix: str) -> str:
    kind, _, route = link.partition(":")
    src, _, dst = route.partition("-")
    return f"{kind}:{prefix}{src}-{prefix}{dst}"


class Assembler:
    """Turns read files into finished span batches in the staging folder."""

    def __init__(
        self, staging: Staging, seed: bytes, align: str, within: Within | None = None
    ) -> None:
        self.staging, self.seed, self.align = staging, seed, align
        self.within = within
        self._seed_int = np.uint64(int.from_bytes(seed[:8], "big") & ((1 << 63) - 1))
        self._traces: list[bytes] = []
        self._trace_index: dict[Any, int] = {}
        self.offsets: dict[int, int] = {}
        self._host_prefix: dict[int, str] = {}

    def _trace(self, key: Any) -> int:
        if key not in self._trace_index:
            self._trace_index[key] = len(self._traces)
            self._traces.append(tree.trace_id(self.seed, *key))
        return self._trace_index[key]

    def finish(self, files: list[Pending]) -> int:
        """Write every file's spans; returns the number written."""
        self.offsets = align_offsets(files, self.align)
        # Into a recorded run, chips are named as the run's own spans name them.
        prefixes = qualifier(files) if self.within is None else {f.no: "" for f in files}
        # ... except the host's: each rank of a multi-rank job is a process of its own, so
        # its CPU is `rankR/cpu:0` (the run's spans name GPUs by local rank already).
        self._host_prefix = {} if self.within is None else self._rank_prefix(files)
        total = 0
        for f in files:
            total += self._file(f, prefixes[f.no])
            f.blocks.clear()
        return total

    def _rank_prefix(self, files: list[Pending]) -> dict[int, str]:
        """`rankR/` per file when the recorded run is one rank of several sharing the
        store (its own resource says so: `chiptrace record -- torchrun`)."""
        assert self.within is not None
        rank = self.within.resource.get("distributed.rank")
        size = self.within.resource.get("distributed.world_size")
        if not (isinstance(rank, int) and isinstance(size, int) and size > 1):
            return {}
        return {f.no: f"rank{rank}/" for f in files}

    def write_file(self, f: Pending, prefix: str) -> int:
        """One file's spans, with `offsets` and `prefix` decided already (over every file,
        by `finish` or a cluster's client: chiptrace.importers.tasks); returns the count."""
        return self._file(f, prefix)

    def _file(self, f: Pending, prefix: str) -> int:
        start, end = f.take("start"), f.take("end")
        n = len(start)
        if n == 0:
            return 0
        role = f.take("role")
        t = tree.build(start, end, f.take("thread"), role, f.take("corr"))
        offset = f.facts.base_ns + self.offsets.get(f.no, 0)
        adopted = None
        if self.within is not None:
            adopted = self.within.adopt(start + offset, end + offset, role, t)
        del role
        ids = self._ids(f, t, adopted)
        launch_row = t.launch_row
        del t  # parents and steps are in ids now: ~16 bytes a span less while writing
        traces = np.frombuffer(b"".join(self._traces), np.uint8).reshape(-1, 16)
        const = self._constants(f, prefix)
        row = 0
        for block in f.blocks:
            static = read_spill(block.spill)  # type: ignore[arg-type]  # staged by the reader
            k = static.num_rows
            sl = slice(row, row + k)
            cols = dict(zip(static.schema.names, static.columns, strict=True))
            if prefix:
                cols["chip_id"] = _prefixed(cols["chip_id"], lambda v: prefix + v)
                cols["link_src"] = _prefixed(cols["link_src"], lambda v: prefix + v)
                cols["link_dst"] = _prefixed(cols["link_dst"], lambda v: prefix + v)
                cols["link_id"] = _prefixed(cols["link_id"], lambda v: _qualify_link(v, prefix))
            hp = self._host_prefix.get(f.no)
            if hp:
                cols["chip_id"] = _prefixed(
                    cols["chip_id"], lambda v, p=hp: p + v if v.startswith("cpu:") else v
                )
            launch = launch_row[sl]
            has_link = launch >= 0
            lr = launch[has_link]
            cols.update(
                trace_id=(
                    ids.given_trace.slice(row, k)
                    if ids.given_trace is not None
                    else fixed_binary(traces[ids.trace[sl]])
                ),
                span_id=ids_to_binary(ids.span[sl]),
                parent_span_id=ids_to_binary(ids.parent[sl], zero_is_null=True),
                start_ns=arrow.numeric(start[sl] + offset),
                end_ns=arrow.numeric(end[sl] + offset),
                links=_links(cols.get("links"), has_link, traces[ids.trace[lr]], ids.span[lr]),
                **{
                    c: arrow.constant(v, k)
                    for c, v in const.items()
                    if cols.get(c) is None or cols[c].null_count == k
                },
            )
            self.staging.write(_batch(cols, k))
            row += k
        return n

    def _ids(self, f: Pending, t: tree.Tree, adopted: np.ndarray | None = None) -> _Ids:
        """Span and parent ids, and each span's trace (an index into self._traces);
        `adopted`: the run span each row hangs under (see chiptrace.importers.within)."""
        n = len(t.parent)
        step = f.take("step")
        base = np.uint64(f.no << 40) + self._seed_int
        span_ids = tree.splitmix64(base + np.arange(1, n + 1, dtype=np.uint64))
        parents = np.where(t.parent >= 0, span_ids[np.maximum(t.parent, 0)], np.uint64(0))
        steps = np.sort(step[step >= 0])  # np.unique alone would import numpy.ma (15 ms)
        steps = steps[np.r_[True, steps[1:] != steps[:-1]]] if len(steps) else steps
        lut = np.array([self._trace(("step", s)) for s in steps.tolist()], np.int32)
        trace = np.full(n, self._trace(("file", f.no)), np.int32)
        has_step = t.step_row >= 0
        trace[has_step] = lut[np.searchsorted(steps, step[t.step_row[has_step]])]
        if self.within is not None and adopted is not None:
            self._adopt(self.within, t.parent, adopted, parents, trace)
        given = [b.ids for b in f.blocks if b.ids is not None]
        if not given:
            return _Ids(span_ids, parents, trace)
        # The file carries its own ids (chiptrace's Chrome export): keep them.
        g_span = np.concatenate([g["span"] for g in given])
        g_parent = np.concatenate([g["parent"] for g in given])
        g_trace = [x for g in given for x in g["trace"]]
        has = g_span != 0
        given_trace = trace_ids_to_binary(
            [x if x else self._traces[k] for x, k in zip(g_trace, trace.tolist(), strict=True)]
        )
        return _Ids(
            np.where(has, g_span, span_ids), np.where(has, g_parent, parents), trace, given_trace
        )

    def _adopt(
        self,
        within: Within,
        parent: np.ndarray,
        adopted: np.ndarray,
        parents: np.ndarray,
        trace: np.ndarray,
    ) -> None:
        """Rows under a run span take its span id as parent; their trees take its trace."""
        has = adopted >= 0
        parents[has] = within.span_id[adopted[has]]
        top = adopted[tree.roots_of(parent)]
        under = top >= 0
        if not under.any():
            return
        used = np.flatnonzero(np.bincount(top[under], minlength=len(within.span_id)))
        lut = np.zeros(len(within.span_id), np.int32)
        lut[used] = [self._given(within.trace_id[k].tobytes()) for k in used.tolist()]
        trace[under] = lut[top[under]]

    def _given(self, raw: bytes) -> int:
        """The index of a trace id given as it is (a run span's), not derived from a key."""
        key = ("given", raw)
        if key not in self._trace_index:
            self._trace_index[key] = len(self._traces)
            self._traces.append(raw)
        return self._trace_index[key]

    def _constants(self, f: Pending, prefix: str) -> dict[str, str]:
        facts = f.facts
        res, host = dict(facts.resource), facts.host
        if self.within is not None:
            res, host = self.within.identity(res)
        if self.offsets.get(f.no):
            res["chiptrace.clock_offset_ns"] = self.offsets[f.no]
        service = res.get("service.name", "trace")
        if prefix:
            service = f"{service} {prefix.rstrip('/')}"
            res["service.name"] = service
        return {
            "service": str(service),
            "host": str(host or prefix.rstrip("/") or "localhost"),
            "scope": facts.format,
            "resource": dumps(res),
        }


def _links(
    given: pa.Array | None, has: np.ndarray, traces: np.ndarray, spans: np.ndarray
) -> pa.Array:
    """Each row's launch link where one was found, else the links the file gave."""
    found = tree.link_column(has, traces, spans)
    if given is None or given.null_count == len(given):
        return found
    return pc.if_else(pa.array(has), found, given.cast(pa.string()))


def _batch(cols: dict[str, Any], n: int) -> pa.RecordBatch:
    arrays = []
    for fld in SPAN_SCHEMA:
        arr = cols.get(fld.name)
        if arr is None:
            if fld.name == "kind":
                arr = arrow.numeric(np.ones(n, np.int8))
            elif fld.name == "status_code":
                arr = arrow.numeric(np.zeros(n, np.int8))
            else:
                arr = pa.nulls(n, fld.type)
        elif arr.type != fld.type:
            arr = arr.cast(fld.type)
        arrays.append(arr)
    return pa.RecordBatch.from_arrays(arrays, schema=SPAN_SCHEMA)
