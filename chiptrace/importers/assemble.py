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

from chiptrace.importers import tree
from chiptrace.importers.plan import Block, FileFacts, concat
from chiptrace.importers.writer import Staging
from chiptrace.schema import SPAN_SCHEMA, dumps, ids_to_binary, trace_ids_to_binary

_DICT = pa.dictionary(pa.int32(), pa.string())
_US = 1000


@dataclass
class Pending:
    """One read file: its facts and its in-memory columns (blocks concatenated)."""

    no: int
    facts: FileFacts
    blocks: list[Block] = field(default_factory=list)
    ids: bool = False  # the file carried its own span ids (chiptrace's Chrome export)

    def column(self, name: str) -> np.ndarray:
        return concat(self.blocks, name)


def align_offsets(files: list[Pending], mode: str) -> dict[int, int]:
    """ns to add to each file's clock so ranks agree: the median gap between the ends of
    their k-th collectives (a collective ends on all ranks at once), rounded to whole µs.

    Args:
        mode: `nccl`, `none`, or `auto` (nccl when two or more files have NCCL kernels).
    """
    with_nccl = [f for f in files if f.facts.nccl_ends]
    if mode == "none" or len(with_nccl) < 2 or (mode == "auto" and len(with_nccl) < 2):
        return {f.no: 0 for f in files}
    ref = min(
        with_nccl, key=lambda f: (f.facts.rank if f.facts.rank is not None else 1 << 30, f.no)
    )
    ref_ends = np.sort(np.array(ref.facts.nccl_ends, np.int64)) + ref.facts.base_ns
    out = {f.no: 0 for f in files}
    for f in with_nccl:
        if f is ref:
            continue
        ends = np.sort(np.array(f.facts.nccl_ends, np.int64)) + f.facts.base_ns
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
    return pa.DictionaryArray.from_arrays(arr.indices, pa.array(values, pa.string()))


def _qualify_link(link: str, prefix: str) -> str:
    kind, _, route = link.partition(":")
    src, _, dst = route.partition("-")
    return f"{kind}:{prefix}{src}-{prefix}{dst}"


class Assembler:
    """Turns read files into finished span batches in the staging folder."""

    def __init__(self, staging: Staging, seed: bytes, align: str) -> None:
        self.staging, self.seed, self.align = staging, seed, align
        self._seed_int = np.uint64(int.from_bytes(seed[:8], "big") & ((1 << 63) - 1))
        self._traces: list[bytes] = []
        self._trace_index: dict[Any, int] = {}
        self.offsets: dict[int, int] = {}

    def _trace(self, key: Any) -> int:
        if key not in self._trace_index:
            self._trace_index[key] = len(self._traces)
            self._traces.append(tree.trace_id(self.seed, *key))
        return self._trace_index[key]

    def finish(self, files: list[Pending]) -> int:
        """Write every file's spans; returns the number written."""
        self.offsets = align_offsets(files, self.align)
        prefixes = qualifier(files)
        total = 0
        for f in files:
            total += self._file(f, prefixes[f.no])
            f.blocks.clear()
        return total

    def _file(self, f: Pending, prefix: str) -> int:
        start, end = f.column("start"), f.column("end")
        role, step = f.column("role"), f.column("step")
        n = len(start)
        if n == 0:
            return 0
        t = tree.build(start, end, f.column("thread"), role, f.column("corr"))
        base = np.uint64(f.no << 40) + self._seed_int
        span_ids = tree.splitmix64(base + np.arange(1, n + 1, dtype=np.uint64))
        parents = np.where(t.parent >= 0, span_ids[np.maximum(t.parent, 0)], np.uint64(0))
        rest = self._trace(("file", f.no))
        steps = np.unique(step[step >= 0])
        lut = {int(s): self._trace(("step", int(s))) for s in steps}
        step_trace = np.full(n, rest, np.int64)
        has_step = t.step_row >= 0
        step_trace[has_step] = [lut[int(s)] for s in step[t.step_row[has_step]]]
        table = trace_ids_to_binary(self._traces)
        trace_col = None
        given = [b.ids for b in f.blocks if b.ids is not None]
        if given:  # the file carries its own ids (chiptrace's Chrome export): keep them
            g_span = np.concatenate([g["span"] for g in given])
            g_parent = np.concatenate([g["parent"] for g in given])
            g_trace = [t for g in given for t in g["trace"]]
            has = g_span != 0
            span_ids = np.where(has, g_span, span_ids)
            parents = np.where(has, g_parent, parents)
            trace_col = trace_ids_to_binary(
                [t if t else self._traces[k] for t, k in zip(g_trace, step_trace, strict=True)]
            )
        has_link = t.launch_row >= 0
        links = None
        if has_link.any():
            lr = np.maximum(t.launch_row, 0)
            trace_hex = pa.array([tid.hex() for tid in self._traces], pa.string())
            links = tree.link_column(
                has_link, trace_hex.take(pa.array(step_trace[lr])), tree.hex64(span_ids[lr])
            )
        offset = f.facts.base_ns + self.offsets.get(f.no, 0)
        const = self._constants(f, prefix)
        row = 0
        for static in self.staging.read_spill(f.no):
            k = static.num_rows
            sl = slice(row, row + k)
            cols = dict(zip(static.schema.names, static.columns, strict=True))
            if prefix:
                cols["chip_id"] = _prefixed(cols["chip_id"], lambda v: prefix + v)
                cols["link_src"] = _prefixed(cols["link_src"], lambda v: prefix + v)
                cols["link_dst"] = _prefixed(cols["link_dst"], lambda v: prefix + v)
                cols["link_id"] = _prefixed(cols["link_id"], lambda v: _qualify_link(v, prefix))
            cols.update(
                trace_id=(
                    trace_col.slice(row, k)
                    if trace_col is not None
                    else table.take(pa.array(step_trace[sl]))
                ),
                span_id=ids_to_binary(span_ids[sl]),
                parent_span_id=ids_to_binary(parents[sl], zero_is_null=True),
                start_ns=pa.array(start[sl] + offset),
                end_ns=pa.array(end[sl] + offset),
                links=links.slice(row, k) if links is not None else pa.nulls(k, pa.string()),
                **{
                    c: pa.DictionaryArray.from_arrays(np.zeros(k, np.int32), [v])
                    for c, v in const.items()
                    if cols.get(c) is None or cols[c].null_count == k
                },
            )
            self.staging.write(_batch(cols, k))
            row += k
        return n

    def _constants(self, f: Pending, prefix: str) -> dict[str, str]:
        facts = f.facts
        res = dict(facts.resource)
        if self.offsets.get(f.no):
            res["chiptrace.clock_offset_ns"] = self.offsets[f.no]
        service = res.get("service.name", "trace")
        if prefix:
            service = f"{service} {prefix.rstrip('/')}"
            res["service.name"] = service
        return {
            "service": str(service),
            "host": str(facts.host or prefix.rstrip("/") or "localhost"),
            "scope": facts.format,
            "resource": dumps(res),
        }


def _batch(cols: dict[str, Any], n: int) -> pa.RecordBatch:
    arrays = []
    for fld in SPAN_SCHEMA:
        arr = cols.get(fld.name)
        if arr is None:
            if fld.name == "kind":
                arr = pa.array(np.ones(n, np.int8))
            elif fld.name == "status_code":
                arr = pa.array(np.zeros(n, np.int8))
            else:
                arr = pa.nulls(n, fld.type)
        elif arr.type != fld.type:
            arr = arr.cast(fld.type)
        arrays.append(arr)
    return pa.RecordBatch.from_arrays(arrays, schema=SPAN_SCHEMA)
