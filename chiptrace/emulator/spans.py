"""Span columns in bulk: workloads add whole arrays of spans, this turns them into batches.

Workloads never build a span object. They call `SpanTable.add` with NumPy arrays (one entry
per span) and get the new span ids back, to use as parents or link targets. Ids come from
one seeded generator in call order, so the same seed gives the same ids. Pending spans are
turned into one Arrow batch (dictionary-coded names, chips and links) and handed to the
recorder in chunks, so a run of any length holds at most a chunk in memory.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from chiptrace.emulator.network import Network
from chiptrace.emulator.topology_files import Topology
from chiptrace.schema import (
    CHIP_TYPES,
    LINK_TYPES,
    OP_KINDS,
    PRECISIONS,
    batch_from_columns,
    dumps,
    ids_to_binary,
)

_STR = pa.string()
OP = {k: i for i, k in enumerate(OP_KINDS)}
PREC = {p: i for i, p in enumerate(PRECISIONS)}
_FIELDS = (
    "trace",
    "span",
    "parent",
    "name",
    "start",
    "end",
    "chip",
    "dir",
    "op",
    "bytes",
    "flops",
    "prec",
)
_DTYPES = (
    np.int32,
    np.uint64,
    np.uint64,
    np.int32,
    np.int64,
    np.int64,
    np.int32,
    np.int32,
    np.int8,
    np.int64,
    np.int64,
    np.int8,
)


def _dict_array(idx: np.ndarray, dictionary: pa.Array) -> pa.Array:
    mask = idx < 0
    if not mask.any():
        return pa.DictionaryArray.from_arrays(
            pa.array(idx.astype(np.int32, copy=False)), dictionary
        )
    if mask.all():  # a chip column on transfer spans, a link column on chip ops
        return pa.nulls(len(idx), pa.dictionary(pa.int32(), pa.string()))
    indices = pa.array(np.where(mask, 0, idx).astype(np.int32), mask=mask)
    return pa.DictionaryArray.from_arrays(indices, dictionary)


def _sparse_strings(entries: list[tuple[int, str]], n: int) -> pa.Array:
    """A string column that is null but for a few rows (links, attributes)."""
    if not entries:
        return pa.nulls(n, _STR)
    values: list[str | None] = [None] * n
    for off, payload in entries:
        values[off] = payload
    return pa.array(values, _STR)


class SpanTable:
    """Pending spans of one run, flushed in chunks through `emit(batch)`.

    Args:
        topology: names chips and links (dictionary values).
        network: maps direction ids to link ids and endpoints.
        rng: the run's seeded generator (span and trace ids).
        epoch_ns: Unix time of virtual t = 0.
        emit: receives each finished batch (the recorder).
        constants: per-run columns (service, host, pid, scope, resource).
        chunk_spans: flush once this many spans are pending.
    """

    def __init__(
        self,
        topology: Topology,
        network: Network,
        rng: np.random.Generator,
        epoch_ns: int,
        emit: Callable[[pa.RecordBatch], object],  # what it returns is not used
        constants: dict[str, Any],
        chunk_spans: int = 262_144,
    ) -> None:
        self.rng = rng
        self.epoch_ns = epoch_ns
        self.emit = emit
        self.constants = constants
        self.chunk_spans = chunk_spans
        self.chip_ids = list(topology.chips)
        self.chip_index = {c: i for i, c in enumerate(self.chip_ids)}
        chip_type = np.array(
            [CHIP_TYPES.index(topology.chips[c].type) for c in self.chip_ids], dtype=np.int32
        )
        self._chip_type = chip_type
        ndir = 2 * len(topology.links)
        ends = [network.dir_endpoints(d) for d in range(ndir)]
        self._dir_src = np.array([self.chip_index[s] for s, _ in ends], dtype=np.int32)
        self._dir_dst = np.array([self.chip_index[t] for _, t in ends], dtype=np.int32)
        self._dir_type = np.repeat(
            np.array([LINK_TYPES.index(lk.type) for lk in topology.links], dtype=np.int32), 2
        )
        self._chip_dict = pa.array(self.chip_ids, _STR)
        self._link_dict = pa.array([lk.id for lk in topology.links], _STR)
        self.names: dict[str, int] = {}
        self.traces: list[bytes] = []  # trace ids of handles _trace_base, _trace_base + 1, ...
        self._trace_base = 0
        self._keep_from = 0
        self._pinned: set[int] = set()  # traces still written to after their step (prefetch)
        self._segments: list[tuple[np.ndarray, ...]] = []
        self._links: list[
            tuple[int, str]
        ] = []  # (row offset in pending, JSON) for the few spans with links
        self._attrs: list[
            tuple[int, str]
        ] = []  # the same for the few spans with generic attributes
        self.pending = 0
        self.total = 0

    def name(self, name: str) -> int:
        """Dictionary index of a span name."""
        idx = self.names.get(name)
        if idx is None:
            idx = self.names[name] = len(self.names)
        return idx

    def new_trace(self) -> int:
        """A fresh 16-byte trace id from the seeded generator; returns its handle."""
        self.traces.append(self.rng.bytes(16))
        return self._trace_base + len(self.traces) - 1

    def begin_step(self) -> None:
        """Mark a step boundary: traces opened before it are finished and may be forgotten
        at the next flush, so a run of a million requests does not keep a million ids."""
        self._keep_from = self._trace_base + len(self.traces)

    def pin(self, trace: int) -> int:
        """Keep a trace's id past its step (a workload adds to it later); returns it."""
        self._pinned.add(trace)
        return trace

    def unpin(self, trace: int) -> None:
        self._pinned.discard(trace)

    def ids(self, n: int) -> np.ndarray:
        """n fresh non-zero 64-bit span ids."""
        out = self.rng.bit_generator.random_raw(n).astype(np.uint64)
        out[out == 0] = 1
        return out

    def add(
        self,
        trace: int | np.ndarray,
        name: int | np.ndarray,
        start: Any,
        end: Any,
        parent: Any = 0,
        *,
        chip: Any = -1,
        dir: Any = -1,
        op: str | None = None,
        nbytes: Any = -1,
        flops: Any = -1,
        precision: str | None = None,
        span_ids: np.ndarray | None = None,
        links: Sequence[Sequence[tuple[int, int]] | None] | None = None,
        attrs: Sequence[Mapping[str, Any] | None] | None = None,
    ) -> np.ndarray:
        """Add spans (arrays broadcast to one length; times in virtual ns). Returns span ids.

        `chip` is a chip index, `dir` a link direction id, -1 for none; `nbytes`/`flops` -1
        for none. Pass `span_ids` to use ids drawn earlier (for links to spans added later).
        `links` gives per span the (trace handle, span id) pairs it waited on (OTel links);
        `attrs` per span the attributes outside the schema's columns (step, batch size).
        """
        shape = np.broadcast_shapes(
            *(np.shape(x) for x in (trace, name, start, end, parent, chip, dir, nbytes, flops))
        )
        n = int(shape[0]) if shape else 1
        sid = self.ids(n) if span_ids is None else span_ids
        values = (
            trace,
            sid,
            parent,
            name,
            np.rint(start),
            np.rint(end),
            chip,
            dir,
            OP[op] if op else -1,
            nbytes,
            flops,
            PREC[precision] if precision else -1,
        )
        self._segments.append(
            tuple(
                np.broadcast_to(np.asarray(v).astype(t, copy=False), (n,))
                for v, t in zip(values, _DTYPES, strict=True)
            )
        )
        if links is not None:
            for i, targets in enumerate(links):
                if targets:
                    self._links.append((self.pending + i, self._links_json(targets)))
        for i, a in enumerate(attrs or ()):
            if a:
                self._attrs.append((self.pending + i, dumps(a)))
        self.pending += n
        if self.pending >= self.chunk_spans:  # flush mid-step too: memory stays at about a chunk
            self.flush()
        return sid

    def _links_json(self, targets: Sequence[tuple[int, int]], relation: str = "input") -> str:
        return dumps(
            [
                {
                    "trace_id": self.traces[t - self._trace_base].hex(),
                    "span_id": f"{int(s):016x}",
                    "attributes": {"chiptrace.relation": relation},
                }
                for t, s in targets
            ]
        )

    def maybe_flush(self) -> None:
        if self.pending >= self.chunk_spans:
            self.flush()

    def flush(self) -> None:
        """Turn pending spans into one batch and emit it."""
        if not self.pending:
            return
        cols = [np.concatenate([seg[i] for seg in self._segments]) for i in range(len(_FIELDS))]
        self.emit(self._batch(dict(zip(_FIELDS, cols, strict=True))))
        self.total += self.pending
        self._segments.clear()
        self._links.clear()
        self._attrs.clear()
        self.pending = 0
        drop = min([self._keep_from, *self._pinned]) - self._trace_base
        if drop > 0:
            del self.traces[:drop]
            self._trace_base += drop

    def _batch(self, c: dict[str, np.ndarray]) -> pa.RecordBatch:
        n = len(c["span"])
        traces = np.frombuffer(b"".join(self.traces), dtype=np.uint8).reshape(-1, 16)
        rows = traces[c["trace"] - self._trace_base]
        tid = pa.FixedSizeBinaryArray.from_buffers(
            pa.binary(16), n, [None, pa.py_buffer(rows.tobytes())]
        )
        chip, d = c["chip"], c["dir"]
        has_dir = d >= 0
        safe = np.where(has_dir, d, 0)

        names = pa.array(sorted(self.names, key=self.names.__getitem__), _STR)
        cols = {
            "trace_id": tid,
            "span_id": ids_to_binary(c["span"]),
            "parent_span_id": ids_to_binary(c["parent"], zero_is_null=True),
            "name": _dict_array(c["name"], names),
            "start_ns": c["start"] + self.epoch_ns,
            "end_ns": c["end"] + self.epoch_ns,
            "chip_id": _dict_array(chip, self._chip_dict),
            "chip_type": _dict_array(
                np.where(chip >= 0, self._chip_type[np.maximum(chip, 0)], -1),
                pa.array(CHIP_TYPES, _STR),
            ),
            "link_id": _dict_array(np.where(has_dir, safe // 2, -1), self._link_dict),
            "link_type": _dict_array(
                np.where(has_dir, self._dir_type[safe], -1), pa.array(LINK_TYPES, _STR)
            ),
            "link_src": _dict_array(np.where(has_dir, self._dir_src[safe], -1), self._chip_dict),
            "link_dst": _dict_array(np.where(has_dir, self._dir_dst[safe], -1), self._chip_dict),
            "op_kind": _dict_array(c["op"].astype(np.int32), pa.array(OP_KINDS, _STR)),
            "op_bytes": pa.array(c["bytes"], mask=c["bytes"] < 0),
            "op_flops": pa.array(c["flops"], mask=c["flops"] < 0),
            "op_precision": _dict_array(c["prec"].astype(np.int32), pa.array(PRECISIONS, _STR)),
            "links": _sparse_strings(self._links, n),
            "attributes": _sparse_strings(self._attrs, n),
            **self.constants,
        }
        return batch_from_columns(cols, n)
