"""PyTorch profiler (Kineto) traces -> span blocks.

Kineto writes Trace Event JSON: host events (cpu_op, python_function, user_annotation,
cuda_runtime, ...) on the process's threads, device events (kernel, gpu_memcpy, gpu_memset,
cuda_sync, mtia_ccp_events) with pid = device and tid = stream, `ac2g` flows and a shared
`correlation` id from each runtime call to the device work it launched, `ProfilerStep#N`
annotations, and `distributedInfo` (rank, world size) in the header. Mapping:

- device work -> a span on `gpu:D` (CUDA and ROCm) or `npu:D` (MTIA); op.kind compute,
  comm (NCCL/RCCL kernels, with the collective's bytes from its message size and dtype),
  memcpy (host<->device copies are also a transfer on the PCIe/C2C link), memset, sync;
  the stream stays an attribute;
- host events -> spans on the rank's `cpu:0`, op.kind host, or launch for runtime calls;
- every event's args -> attributes, plus `kineto.cat` and `thread.id`.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import msgspec
import numpy as np
import pyarrow as pa

from chiptrace.importers import events as ev
from chiptrace.importers.plan import (
    ROLE_CPU,
    ROLE_DEVICE,
    ROLE_FREE,
    ROLE_LAUNCH,
    ROLE_STEP,
    Block,
    FileFacts,
)
from chiptrace.importers.source import TraceEventStream

DEVICE_CATS = frozenset({"kernel", "gpu_memcpy", "gpu_memset", "cuda_sync", "mtia_ccp_events"})
LAUNCH_CATS = frozenset({"cuda_runtime", "cuda_driver", "mtia_runtime", "privateuse1_runtime"})
FREE_CATS = frozenset({"gpu_user_annotation", "Trace"})
_COMM = re.compile(r"(nccl|rccl)", re.IGNORECASE)
_STEP = re.compile(r"ProfilerStep\s*#\s*(\d+)")
# Element sizes of the dtypes NCCL kernels record (c10 scalar type names, lower case).
_DTYPE_BYTES = dict.fromkeys(("double", "float64", "long", "int64"), 8)
_DTYPE_BYTES.update(dict.fromkeys(("float", "float32", "int", "int32"), 4))
_DTYPE_BYTES.update(dict.fromkeys(("half", "float16", "bfloat16", "short", "int16"), 2))
_DTYPE_BYTES.update(
    dict.fromkeys(("char", "byte", "int8", "uint8", "bool", "float8_e4m3fn", "float8_e5m2"), 1)
)


class DeviceArgs(
    msgspec.Struct,
    gc=False,
    rename={
        "collective": "Collective name",
        "in_nelems": "In msg nelems",
        "out_nelems": "Out msg nelems",
        "group_size": "Group size",
    },
):
    """The args fields the mapping reads; every arg is also kept as an attribute."""

    correlation: int = -1
    device: int = -1
    stream: int | str = -1
    bytes: int = -1
    collective: str = ""
    in_nelems: int = -1
    out_nelems: int = -1
    group_size: int = -1
    dtype: str = ""
    kind: str = ""


_ARGS = msgspec.json.Decoder(list[DeviceArgs])


def link_type_for(device_names: list[str]) -> str:
    """The host link of a device by its name: Grace-Hopper/Blackwell C2C, else PCIe 5 from
    Hopper on, else PCIe 4 (A100, MI250 and older)."""
    names = " ".join(device_names).upper()
    if any(k in names for k in ("GH200", "GB200", "GB300")):
        return "c2c"
    if any(k in names for k in ("H100", "H200", "H800", "B200", "B100", "MI300", "L40")):
        return "pcie5"
    return "pcie4"


def dtype_bytes(dtype: str) -> int | None:
    return _DTYPE_BYTES.get(dtype.lower().replace("c10::", ""))


class KinetoReader:
    """Reads one Kineto file into span blocks; `facts` is complete after `blocks()`."""

    format = "kineto"

    def __init__(self, path: str) -> None:
        self.stream = TraceEventStream(path, ev.Event)
        self.facts = FileFacts(path=str(path), format=self.format)
        self.tally = ev.Tally()
        self._threads: dict[tuple[int, int], int] = {}
        self._names: dict[int, str] = {}  # pid -> process name
        self._kinds: dict[tuple[str, str], tuple[str, str | None]] = {}
        self._link = "pcie4"

    def blocks(self) -> Iterator[Block]:
        cats: dict[str, int] = {}
        for events in self.stream:
            if not self.facts.events:
                self._header(self.stream.header)
            self.facts.events += len(events)
            others: list[ev.Event] = []
            rows = ev.split_block(events, self.tally, others)
            self._others(others)
            if len(rows):
                for c in rows.cat:
                    cats[c] = cats.get(c, 0) + 1
                yield self._block(rows)
        self._header(self.stream.header)
        self.facts.categories = cats
        self.facts.tally = self.tally.as_dict()

    # ------------------------------------------------------------ header and metadata

    def _header(self, h: dict[str, Any]) -> None:
        info = h.get("distributedInfo") if isinstance(h.get("distributedInfo"), dict) else {}
        f = self.facts
        f.rank = _int(info.get("rank"))
        f.world_size = _int(info.get("world_size"))
        f.base_ns = _int(h.get("baseTimeNanoseconds")) or 0
        props = h.get("deviceProperties") if isinstance(h.get("deviceProperties"), list) else []
        self._link = link_type_for([str(p.get("name", "")) for p in props if isinstance(p, dict)])
        res: dict[str, Any] = {"service.name": "pytorch", "telemetry.sdk.name": "kineto"}
        for key, name in (("rank", "distributed.rank"), ("world_size", "distributed.world_size")):
            if _int(info.get(key)) is not None:
                res[name] = _int(info.get(key))
        for key, name in (("backend", "distributed.backend"), ("nccl_version", "nccl.version")):
            if isinstance(info.get(key), str):
                res[name] = info[key]
        if isinstance(h.get("host_name"), str):
            res["host.name"] = h["host_name"]
        if props:
            res["device.names"] = sorted(
                {str(p.get("name", "")) for p in props if isinstance(p, dict)}
            )
        cpu_pids = [p for p, n in self._names.items() if n]
        if cpu_pids:
            res["process.pid"] = cpu_pids[0]
            res["process.executable.name"] = self._names[cpu_pids[0]]
        res["kineto.file"] = str(self.facts.path).rsplit("/", 1)[-1]
        f.resource = res
        f.host = res.get("host.name")

    def _others(self, others: list[ev.Event]) -> None:
        t = self.tally
        for e in others:
            if e.ph == "M":
                t.metadata += 1
                if e.name == "process_labels" and isinstance(e.pid, int):
                    labels = _arg(e.args, "labels")
                    if labels == "CPU" and e.pid not in self._names:
                        self._names[e.pid] = ""
                elif e.name == "process_name" and isinstance(e.pid, int):
                    name = _arg(e.args, "name")
                    if isinstance(name, str) and self._names.get(e.pid, "") == "":
                        self._names[e.pid] = name
            elif e.ph in ("s", "t", "f"):
                t.flows += 1  # ac2g flows repeat the correlation id: links come from it
            else:
                t.skipped[f"ph={e.ph or '?'}" + (f" ({e.name})" if e.ph in "iI" else "")] += 1

    # ------------------------------------------------------------ one block

    def _block(self, rows: ev.Rows) -> Block:
        n = len(rows)
        pid, tid = ev.id_ints(rows.pid), ev.id_ints(rows.tid)
        start = ev.us_to_ns(rows.ts)
        end = start + np.rint(np.asarray(rows.dur, np.float64) * 1000).astype(np.int64)
        role = np.full(n, ROLE_CPU, np.int8)
        corr = np.full(n, -1, np.int64)
        step = np.full(n, -1, np.int64)
        chip = np.zeros(n, np.int32)  # index into chips
        chips: dict[str, int] = {"cpu:0": 0}
        op_kind: list[str | None] = ["host"] * n
        op_bytes = np.full(n, -1, np.int64)
        link = [None] * n
        special = [
            i
            for i, c in enumerate(rows.cat)
            if c in DEVICE_CATS or c in LAUNCH_CATS or c in FREE_CATS or c == "user_annotation"
        ]
        need_args = [i for i in special if rows.cat[i] in DEVICE_CATS or rows.cat[i] in LAUNCH_CATS]
        parsed = (
            _ARGS.decode(b"[" + b",".join(bytes(rows.args[i]) or b"{}" for i in need_args) + b"]")
            if need_args
            else []
        )
        args_of = dict(zip(need_args, parsed, strict=True))
        for i in special:
            cat, name = rows.cat[i], rows.name[i]
            if cat in LAUNCH_CATS:
                op_kind[i] = "launch"
                corr[i] = args_of[i].correlation
                if corr[i] >= 0:
                    role[i] = ROLE_LAUNCH
            elif cat in DEVICE_CATS:
                a = args_of[i]
                role[i], corr[i] = ROLE_DEVICE, a.correlation
                dev = a.device if a.device >= 0 else (pid[i] if pid[i] >= 0 else 0)
                ctype = "npu" if cat.startswith("mtia") else "gpu"
                chip[i] = chips.setdefault(f"{ctype}:{dev}", len(chips))
                kind, direction = self._kind(cat, name)
                op_kind[i] = kind
                if kind == "comm":
                    op_bytes[i] = _comm_bytes(a)
                    self.facts.nccl_ends.append(int(end[i]))
                elif a.bytes >= 0:
                    op_bytes[i] = a.bytes
                if direction and a.bytes >= 0:  # a transfer always carries op.bytes
                    link[i] = (direction, f"{ctype}:{dev}")
            elif cat in FREE_CATS:
                role[i], op_kind[i], chip[i] = ROLE_FREE, None, -1
            elif name.startswith("ProfilerStep"):
                m = _STEP.match(name)
                if m:
                    role[i], step[i] = ROLE_STEP, int(m.group(1))
        static = self._static(rows, chip, chips, op_kind, op_bytes, link, pid, tid)
        return Block(static, start, end, self._thread_keys(pid, tid), role, corr, step)

    def _kind(self, cat: str, name: str) -> tuple[str, str | None]:
        """(op kind, copy direction or None) for a device event, cached per (cat, name)."""
        key = (cat, name)
        hit = self._kinds.get(key)
        if hit is not None:
            return hit
        direction = None
        if cat == "gpu_memcpy":
            kind = "memcpy"
            tag = name[7:11] if name.startswith("Memcpy ") else ""
            direction = tag if tag in ("HtoD", "DtoH") else None
        elif cat == "gpu_memset":
            kind = "memset"
        elif cat == "cuda_sync":
            kind = "sync"
        elif cat == "mtia_ccp_events":
            low = name.lower()
            kind = "memcpy" if low.startswith("dma") else "sync" if "event" in low else "compute"
        else:
            kind = "comm" if _COMM.match(name) else "compute"
        self._kinds[key] = (kind, direction)
        return kind, direction

    def _static(self, rows, chip, chips, op_kind, op_bytes, link, pid, tid) -> pa.RecordBatch:  # type: ignore[no-untyped-def]
        n = len(rows)
        names = list(chips)
        valid = chip >= 0
        chip_arr = pa.DictionaryArray.from_arrays(
            ev.masked(chip, valid, pa.int32()), pa.array(names, pa.string())
        )
        types = pa.DictionaryArray.from_arrays(
            ev.masked(chip, valid, pa.int32()),
            pa.array([c.partition(":")[0] for c in names], pa.string()),
        )
        link_id, link_src, link_dst = [None] * n, [None] * n, [None] * n
        for i, lk in enumerate(link):
            if lk is not None:
                direction, dev = lk
                link_id[i] = f"{self._link}:cpu:0-{dev}"
                link_src[i], link_dst[i] = ("cpu:0", dev) if direction == "HtoD" else (dev, "cpu:0")
        has_link = any(x is not None for x in link_id)
        cats = ev.dict_column(rows.cat)
        cat_json = pa.array([ev.json_text(c) for c in cats.dictionary.to_pylist()], pa.string())
        prefix = pa.compute.binary_join_element_wise(
            '"kineto.cat":',
            cat_json.take(cats.indices),
            ',"thread.id":',
            ev.json_texts(rows.tid),
            "",
        )
        columns = {
            "name": ev.dict_column(rows.name),
            "chip_id": chip_arr,
            "chip_type": types,
            "op_kind": pa.array(op_kind, pa.string()).dictionary_encode(),
            "op_bytes": ev.masked(op_bytes, op_bytes >= 0, pa.int64()),
            "attributes": ev.args_attributes(rows.args, prefix),
            "pid": ev.masked(
                np.where((pid >= 0) & (pid < 1 << 31), pid, 0),
                (pid >= 0) & (pid < 1 << 31),
                pa.int32(),
            ),
        }
        if has_link:
            columns["link_id"] = ev.dict_column(link_id)
            columns["link_type"] = pa.array(
                [self._link if x else None for x in link_id], pa.string()
            ).dictionary_encode()
            columns["link_src"] = ev.dict_column(link_src)
            columns["link_dst"] = ev.dict_column(link_dst)
        return static_batch(columns, n)

    def _thread_keys(self, pid: np.ndarray, tid: np.ndarray) -> np.ndarray:
        pairs = np.stack([pid, tid], axis=1)
        uniq, inverse = np.unique(pairs, axis=0, return_inverse=True)
        ids = np.array(
            [self._threads.setdefault((int(p), int(t)), len(self._threads)) for p, t in uniq],
            np.int64,
        )
        return ids[inverse.reshape(-1)]


def static_batch(columns: dict[str, Any], n: int) -> pa.RecordBatch:
    from chiptrace.importers.plan import STATIC_COLUMNS
    from chiptrace.schema import SPAN_SCHEMA

    arrays, fields = [], []
    for name in STATIC_COLUMNS:
        field = SPAN_SCHEMA.field(name)
        value = columns.get(name)
        if value is None and name in ("kind", "status_code"):
            value = pa.array(np.full(n, 1 if name == "kind" else 0, np.int8))
        arr = pa.nulls(n, field.type) if value is None else value
        if arr.type != field.type:
            arr = arr.cast(field.type)
        arrays.append(arr)
        fields.append(field)
    return pa.RecordBatch.from_arrays(arrays, schema=pa.schema(fields))


def _comm_bytes(a: DeviceArgs) -> int:
    size = dtype_bytes(a.dtype) if a.dtype else None
    nelems = max(a.in_nelems, a.out_nelems)
    return nelems * size if size is not None and nelems >= 0 else -1


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


_ANY = msgspec.json.Decoder()


def _arg(raw: msgspec.Raw, key: str) -> Any:
    try:
        value = _ANY.decode(bytes(raw)) if bytes(raw) else {}
    except msgspec.DecodeError:
        return None
    return value.get(key) if isinstance(value, dict) else None
