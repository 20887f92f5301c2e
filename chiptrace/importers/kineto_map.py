"""One block of decoded Kineto events -> span columns, a column at a time.

Python touches each event a handful of times, in list comprehensions that read one field
(`[e.ts for e in xs]`, ~30 ns an event each); every decision (category, chip, op kind,
role, step, link, bytes) is made once per distinct value (category, name, device) and
spread over the rows by NumPy indexing, and the attributes JSON is spliced by Arrow
kernels. Only the args of runtime calls and device work are parsed (for the correlation
id, device, bytes and NCCL message size). A block maps on its own: nothing here depends
on another block, so blocks can map in any order or process.
"""

from __future__ import annotations

import itertools
import operator
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import msgspec
import numpy as np
import pyarrow as pa

from chiptrace.importers import arrow
from chiptrace.importers import events as ev
from chiptrace.importers.categories import (
    ANNOTATION,
    DEVICE,
    FREE,
    LAUNCH,
    canonical,
    category_class,
)
from chiptrace.importers.plan import ROLE_CPU, ROLE_DEVICE, ROLE_FREE, ROLE_LAUNCH, ROLE_STEP

OP_KINDS = ("host", "launch", "compute", "comm", "memcpy", "memset", "sync")
_OP = {k: i for i, k in enumerate(OP_KINDS)}
_FLOWS = ("s", "t", "f")
_CAT_NAME = operator.attrgetter("cat", "name")
NO_COPY, HTOD, DTOH = 0, 1, 2
_COMM = re.compile(r"(nccl|rccl)", re.IGNORECASE)
_STEP = re.compile(r"ProfilerStep\s*#\s*(\d+)")
# Element sizes of the dtypes NCCL kernels record (c10 scalar type names, lower case).
_DTYPE_BYTES = dict.fromkeys(("double", "float64", "long", "int64"), 8)
_DTYPE_BYTES.update(dict.fromkeys(("float", "float32", "int", "int32"), 4))
_DTYPE_BYTES.update(dict.fromkeys(("half", "float16", "bfloat16", "short", "int16"), 2))
_DTYPE_BYTES.update(
    dict.fromkeys(("char", "byte", "int8", "uint8", "bool", "float8_e4m3fn", "float8_e5m2"), 1)
)


class LaunchArgs(msgspec.Struct, gc=False):
    correlation: int = -1


class DeviceArgs(
    msgspec.Struct,
    gc=False,
    rename={"in_nelems": "In msg nelems", "out_nelems": "Out msg nelems"},
):
    """The args fields the mapping reads; every arg is also kept as an attribute."""

    correlation: int = -1
    device: int = -1
    bytes: int = -1
    in_nelems: int = -1
    out_nelems: int = -1
    dtype: str = ""


_LAUNCH_ARGS = msgspec.json.Decoder(list[LaunchArgs])
_DEVICE_ARGS = msgspec.json.Decoder(list[DeviceArgs])


def dtype_bytes(dtype: str) -> int | None:
    return _DTYPE_BYTES.get(dtype.lower().replace("c10::", ""))


def device_kind(cat: str, name: str) -> tuple[int, int]:
    """(op kind code, copy direction) of a device event."""
    cat = canonical(cat)
    if cat == "gpu_memcpy":
        tag = name[7:11] if name.startswith("Memcpy ") else ""
        return _OP["memcpy"], HTOD if tag == "HtoD" else DTOH if tag == "DtoH" else NO_COPY
    if cat == "gpu_memset":
        return _OP["memset"], NO_COPY
    if cat in ("cuda_sync", "xpu_sync"):
        return _OP["sync"], NO_COPY
    if cat == "mtia_ccp_events":
        low = name.lower()
        kind = "memcpy" if low.startswith("dma") else "sync" if "event" in low else "compute"
        return _OP[kind], NO_COPY
    return _OP["comm" if _COMM.match(name) else "compute"], NO_COPY


@dataclass
class Mapped:
    """One block's spans: the static columns and the numbers the tree builder needs."""

    static: pa.RecordBatch
    start: np.ndarray
    end: np.ndarray
    pid: np.ndarray
    tid: np.ndarray
    role: np.ndarray
    corr: np.ndarray
    step: np.ndarray
    nccl_ends: np.ndarray
    categories: dict[str, int]
    tally: ev.Tally
    metadata: list[tuple[str, Any, bytes]] = field(default_factory=list)  # (name, pid, args)
    events: int = 0  # in the block, spans or not


def map_events(events: list[ev.Event], link_type: str) -> Mapped:
    """Map one block of decoded events (see the module docstring)."""
    tally = ev.Tally()
    metadata: list[tuple[str, Any, bytes]] = []
    xs = _complete(events, tally, metadata)
    dur = np.array([e.dur for e in xs], np.float64)
    if (dur < 0).any():  # an X event without a duration is no span
        keep = dur >= 0
        tally.skipped["X without dur"] += int((~keep).sum())
        xs = list(itertools.compress(xs, keep.tolist()))
        dur = dur[keep]
    pid = ev.id_ints([e.pid for e in xs])[0]
    tid_values = [e.tid for e in xs]
    start = ev.us_to_ns([e.ts for e in xs])
    end = start + np.rint(dur * 1000).astype(np.int64)
    # (category, name) pairs are few: decisions are made per pair, not per event.
    pair_codes, pairs = arrow.encode(map(_CAT_NAME, xs), len(xs))
    rows = _Rows(pid, end, [e.args for e in xs], pair_codes, pairs)
    rows.launches()
    rows.devices()
    rows.steps()
    static = rows.static(link_type, tid_values)
    counts = np.bincount(rows.cat_codes, minlength=len(rows.cats))
    return Mapped(
        static,
        start,
        end,
        pid,
        rows.tid,
        rows.role,
        rows.corr,
        rows.step,
        rows.nccl_ends,
        dict(zip(rows.cats, counts.tolist(), strict=True)),
        tally,
        metadata,
        len(events),
    )


def _complete(
    events: list[ev.Event], tally: ev.Tally, metadata: list[tuple[str, Any, bytes]]
) -> list[ev.Event]:
    """The block's complete (X) events. Flows are counted (ac2g flows repeat the
    correlation id: links come from it), metadata kept for process names, the rest skipped."""
    phs = [e.ph for e in events]
    kinds = Counter(phs)
    if kinds["X"] == len(events):
        return events
    tally.flows += sum(kinds[p] for p in _FLOWS)
    if any(p != "X" and p not in _FLOWS for p in kinds):
        for e, p in zip(events, phs, strict=True):
            if p == "M":
                tally.metadata += 1
                if e.name in ("process_labels", "process_name"):
                    metadata.append((e.name, e.pid, bytes(e.args)))
            elif p != "X" and p not in _FLOWS:
                tally.skipped[f"ph={p or '?'}" + (f" ({e.name})" if p in "iI" else "")] += 1
    return list(itertools.compress(events, map(operator.eq, phs, itertools.repeat("X"))))


class _Rows:
    """The columns of one block while they are decided (see map_events)."""

    def __init__(
        self,
        pid: np.ndarray,  # int64, one per event
        end: np.ndarray,  # int64 ns
        args: list[Any],  # each event's undecoded args
        pair_codes: np.ndarray,  # int32 index into `pairs`
        pairs: list[tuple[str, str]],  # distinct (category, name)
    ) -> None:
        n = len(pid)
        self.n, self.pid, self.end, self.args = n, pid, end, args
        # ProfilerStep#N is a user_annotation now, an `Operator` in the 1.8-1.9 profiler:
        # the step is one whatever the generation (its `Operator` spelling is not kept).
        pairs = [
            ("user_annotation", m) if canonical(c) == "cpu_op" and _STEP.match(m) else (c, m)
            for c, m in pairs
        ]
        self.pair_codes = pair_codes
        pair_cat, self.cats = arrow.encode([c for c, _ in pairs], len(pairs))
        pair_name, self.names = arrow.encode([m for _, m in pairs], len(pairs))
        self.pair_cat, self.pairs = pair_cat, pairs
        self.cat_codes = pair_cat[pair_codes]
        self.name_codes = pair_name[pair_codes]
        cls = np.array([category_class(c) for c in self.cats], np.int8)[self.cat_codes]
        self.cls = cls
        self.role = np.where(cls == FREE, ROLE_FREE, ROLE_CPU).astype(np.int8)
        self.corr = np.full(n, -1, np.int64)
        self.step = np.full(n, -1, np.int64)
        self.op = np.where(cls == FREE, -1, _OP["host"]).astype(np.int8)
        self.op_bytes = np.full(n, -1, np.int64)
        self.chip = np.where(cls == FREE, -1, 0).astype(np.int32)  # 0: cpu:0
        self.chips = ["cpu:0"]
        self.copy = np.zeros(n, np.int8)  # NO_COPY / HTOD / DTOH, where op.bytes is known
        self.nccl_ends = np.zeros(0, np.int64)
        self.tid = np.zeros(n, np.int64)

    def _parse(self, rows: np.ndarray, decoder: msgspec.json.Decoder, type_: Any) -> list[Any]:
        raw = [self.args[i] for i in rows.tolist()]
        try:
            return decoder.decode(b"".join((b"[", b",".join(raw), b"]")))
        except msgspec.DecodeError:  # an args value that is not an object: no fields
            return [_decode_one(type_, r) for r in raw]

    def launches(self) -> None:
        rows = np.flatnonzero(self.cls == LAUNCH)
        if not len(rows):
            return
        parsed = self._parse(rows, _LAUNCH_ARGS, LaunchArgs)
        corr = np.array([a.correlation for a in parsed], np.int64)
        self.corr[rows] = corr
        self.op[rows] = _OP["launch"]
        self.role[rows[corr >= 0]] = ROLE_LAUNCH

    def devices(self) -> None:
        rows = np.flatnonzero(self.cls == DEVICE)
        if not len(rows):
            return
        parsed = self._parse(rows, _DEVICE_ARGS, DeviceArgs)
        self.corr[rows] = [a.correlation for a in parsed]
        self.role[rows] = ROLE_DEVICE
        dev = np.array([a.device for a in parsed], np.int64)
        pid = self.pid[rows]
        dev = np.where(dev >= 0, dev, np.where(pid >= 0, pid, 0))
        npu = np.array([canonical(c).startswith("mtia") for c in self.cats], bool)[
            self.cat_codes[rows]
        ]
        keys, chip = np.unique(dev * 2 + npu, return_inverse=True)
        self.chips += [f"{'npu' if k & 1 else 'gpu'}:{k >> 1}" for k in keys.tolist()]
        self.chip[rows] = 1 + chip.reshape(-1)
        kinds = [
            device_kind(c, m) if category_class(c) == DEVICE else (0, 0) for c, m in self.pairs
        ]
        which = self.pair_codes[rows]
        op = np.array([k for k, _ in kinds], np.int8)[which]
        copy = np.array([c for _, c in kinds], np.int8)[which]
        nbytes = np.array([a.bytes for a in parsed], np.int64)
        self.op[rows] = op
        comm = np.flatnonzero(op == _OP["comm"])
        nbytes[comm] = [_comm_bytes(parsed[i]) for i in comm.tolist()]
        self.op_bytes[rows] = nbytes
        self.nccl_ends = self.end[rows[comm]]
        self.copy[rows] = np.where((op != _OP["comm"]) & (nbytes >= 0), copy, NO_COPY)

    def steps(self) -> None:
        rows = np.flatnonzero(self.cls == ANNOTATION)
        if not len(rows):
            return
        numbers = []
        for name in self.names:
            m = _STEP.match(name)
            numbers.append(int(m.group(1)) if m else -1)
        step = np.array(numbers, np.int64)[self.name_codes[rows]]
        self.step[rows] = step
        self.role[rows[step >= 0]] = ROLE_STEP

    def static(self, link_type: str, tid_values: list[Any]) -> pa.RecordBatch:
        free = self.chip < 0
        chip_valid = None if not free.any() else ~free
        pid_ok = (self.pid >= 0) & (self.pid < 1 << 31)
        columns: dict[str, Any] = {
            "name": arrow.dictionary(self.name_codes, self.names),
            "chip_id": arrow.dictionary(self.chip, self.chips, chip_valid),
            "chip_type": arrow.dictionary(
                self.chip, [c.partition(":")[0] for c in self.chips], chip_valid
            ),
            "op_kind": arrow.dictionary(self.op, OP_KINDS, self.op >= 0),
            "op_bytes": arrow.numeric(self.op_bytes, self.op_bytes >= 0),
            "attributes": self._attributes(tid_values),
            "pid": arrow.numeric(np.where(pid_ok, self.pid, 0).astype(np.int32), pid_ok),
        }
        copies = self.copy != NO_COPY
        if copies.any():
            host = np.zeros(self.n, np.int32)
            columns["link_id"] = arrow.dictionary(
                self.chip, [f"{link_type}:cpu:0-{c}" for c in self.chips], copies
            )
            columns["link_type"] = arrow.dictionary(host, [link_type], copies)
            htod = self.copy == HTOD
            columns["link_src"] = arrow.dictionary(
                np.where(htod, host, self.chip), self.chips, copies
            )
            columns["link_dst"] = arrow.dictionary(
                np.where(htod, self.chip, host), self.chips, copies
            )
        return ev.static_batch(columns, self.n)

    def _attributes(self, tid_values: list[Any]) -> pa.Array:
        """`{"kineto.cat":..,"thread.id":..,<args members>}`: the prefix is one of a few
        (category, thread, has members) texts, the members the raw args."""
        self.tid, odd = ev.id_ints(tid_values)
        tid_key = self.tid
        if odd:  # text thread ids: keyed by their text (stand-ins may collide)
            codes, _ = arrow.encode([tid_values[i] for i in odd], len(odd))
            tid_key = self.tid.copy()
            tid_key[odd] = -(1 << 62) - 1 - codes.astype(np.int64)
        tids, first, tid_codes = np.unique(tid_key, return_index=True, return_inverse=True)
        bodies, members = ev.args_bodies(self.args)
        key = (self.cat_codes.astype(np.int64) * len(tids) + tid_codes.reshape(-1)) * 2 + members
        keys, codes = np.unique(key, return_inverse=True)
        # The category by its current name (what the analysis matches), the original beside
        # it where an older profiler spelled it otherwise.
        cat_json = [
            ev.json_text(canonical(c))
            + ("" if canonical(c) == c else f',"kineto.cat_original":{ev.json_text(c)}')
            for c in self.cats
        ]
        tid_json = [ev.json_text(tid_values[i]) for i in first.tolist()]
        prefixes = [
            f'"kineto.cat":{cat_json[k // 2 // len(tids)]},'
            f'"thread.id":{tid_json[k // 2 % len(tids)]}' + ("," if k & 1 else "")
            for k in keys.tolist()
        ]
        return ev.splice(prefixes, codes.reshape(-1), bodies)


def _comm_bytes(a: DeviceArgs) -> int:
    size = dtype_bytes(a.dtype) if a.dtype else None
    nelems = max(a.in_nelems, a.out_nelems)
    return nelems * size if size is not None and nelems >= 0 else -1


def _decode_one(type_: Any, raw: msgspec.Raw) -> Any:
    try:
        return msgspec.json.decode(raw, type=type_)
    except msgspec.DecodeError:
        return type_()
