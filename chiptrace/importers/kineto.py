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

from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec
import numpy as np

from chiptrace.importers import events as ev
from chiptrace.importers.kineto_map import Mapped, map_events
from chiptrace.importers.plan import Block, FileFacts
from chiptrace.importers.source import BLOCK_BYTES, TraceEventStream
from chiptrace.importers.writer import write_spill

if TYPE_CHECKING:
    from chiptrace.importers.pool import Pool


def link_type_for(device_names: list[str]) -> str:
    """The host link of a device by its name: Grace-Hopper/Blackwell C2C, else PCIe 5 from
    Hopper on, else PCIe 4 (A100, MI250 and older)."""
    names = " ".join(device_names).upper()
    if any(k in names for k in ("GH200", "GB200", "GB300")):
        return "c2c"
    if any(k in names for k in ("H100", "H200", "H800", "B200", "B100", "MI300", "L40")):
        return "pcie5"
    return "pcie4"


class KinetoReader:
    """Reads one Kineto file into span blocks; `facts` is complete after `blocks()`."""

    format = "kineto"

    def __init__(self, path: str, block_bytes: int = BLOCK_BYTES) -> None:
        self.stream = TraceEventStream(path, ev.Event, block_bytes)
        self.facts = FileFacts(path=str(path), format=self.format)
        self.tally = ev.Tally()
        self._threads: dict[tuple[int, int], int] = {}
        self._names: dict[int, str] = {}  # pid -> process name
        self._link = "pcie4"
        self._cats: dict[str, int] = {}
        self._nccl: list[np.ndarray] = []

    def blocks(self, spill_for: Callable[[int], str], pool: Pool | None = None) -> Iterator[Block]:
        """The file's blocks, their static columns staged in `spill_for(block number)`;
        mapped by `pool`'s workers when given (see chiptrace.importers.pool)."""
        stream = self.stream
        stream.in_main = pool is None
        out: deque[tuple[bytes, str, Future[Mapped | None]]] = deque()
        path = str(self.facts.path)
        started = False
        for no, item in enumerate(stream.blocks()):
            if not started:
                self._header(stream.header)
                started = True
            if isinstance(item, bytes):
                assert pool is not None
                spill = spill_for(no)
                out.append((item, spill, pool.submit(item, self._link, spill, path)))
                if len(out) > pool.depth:
                    yield from self._settle(out)
                continue
            while out:  # the barrier before the last events: everything out comes back
                yield from self._settle(out)
            if item is not None:
                m = map_events(item, self._link)
                spill = spill_for(no)
                if m.static.num_rows:
                    write_spill(spill, m.static)
                yield from self._take(m, spill)
        self._header(stream.header)
        self.facts.nccl_ends = np.concatenate(self._nccl) if self._nccl else np.zeros(0, np.int64)
        self.facts.categories = self._cats
        self.facts.tally = self.tally.as_dict()

    def _settle(self, out: deque[tuple[bytes, str, Future[Mapped | None]]]) -> Iterator[Block]:
        """The oldest block out; if it did not decode, it and every later one go back."""
        raw, spill, fut = out.popleft()
        m = fut.result()
        if m is not None:
            yield from self._take(m, spill)
            return
        back = [raw]
        for raw, spill, fut in out:
            fut.result()  # finished before its spill file goes
            back.append(raw)
            Path(spill).unlink(missing_ok=True)
        out.clear()
        self.stream.pushback(back)

    def _take(self, m: Mapped, spill: str) -> Iterator[Block]:
        self._merge(m)
        self.facts.events += m.events
        self._nccl.append(m.nccl_ends)
        if len(m.start):
            thread = self._thread_keys(m.pid, m.tid)
            yield Block(None, m.start, m.end, thread, m.role, m.corr, m.step, spill=spill)

    def _merge(self, m: Mapped) -> None:
        cats = self._cats
        for c, k in m.categories.items():
            cats[c] = cats.get(c, 0) + k
        t = self.tally
        t.metadata += m.tally.metadata
        t.flows += m.tally.flows
        t.skipped.update(m.tally.skipped)
        for name, pid, args in m.metadata:
            if not isinstance(pid, int):
                continue
            if name == "process_labels":
                if _arg(args, "labels") == "CPU" and pid not in self._names:
                    self._names[pid] = ""
            else:
                value = _arg(args, "name")
                if isinstance(value, str) and self._names.get(pid, "") == "":
                    self._names[pid] = value

    # ------------------------------------------------------------ header and metadata

    def _header(self, h: dict[str, Any]) -> None:
        raw_info = h.get("distributedInfo")
        info: dict[str, Any] = raw_info if isinstance(raw_info, dict) else {}
        f = self.facts
        f.rank = _int(info.get("rank"))
        f.world_size = _int(info.get("world_size"))
        f.base_ns = _int(h.get("baseTimeNanoseconds")) or 0
        raw_props = h.get("deviceProperties")
        props: list[Any] = raw_props if isinstance(raw_props, list) else []
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

    def _thread_keys(self, pid: np.ndarray, tid: np.ndarray) -> np.ndarray:
        """A per-file number for each row's (pid, tid): its nesting domain."""
        order = np.lexsort((tid, pid))
        p, t = pid[order], tid[order]
        new = np.ones(len(p), bool)
        new[1:] = (p[1:] != p[:-1]) | (t[1:] != t[:-1])
        ids = np.array(
            [
                self._threads.setdefault(pair, len(self._threads))
                for pair in zip(p[new].tolist(), t[new].tolist(), strict=True)
            ],
            np.int32,
        )
        out = np.empty(len(p), np.int32)
        out[order] = ids[np.cumsum(new) - 1]
        return out


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


_ANY = msgspec.json.Decoder()


def _arg(raw: bytes, key: str) -> Any:
    try:
        value = _ANY.decode(raw) if raw else {}
    except msgspec.DecodeError:
        return None
    return value.get(key) if isinstance(value, dict) else None
