"""psutil probes for the real host: per-CPU utilization, memory, NICs and disks.

Each probe keeps the previous counters and turns their difference into rates, so a
reading costs one /proc read and some arithmetic (about 0.1 ms on Linux). CPU
utilization is computed from `cpu_times` here rather than with `psutil.cpu_percent`,
whose module-level state the traced program may be using too.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Iterator
from typing import Protocol

import psutil

from chiptrace.host.metrics import Sample

log = logging.getLogger("chiptrace")

# Virtual block devices that mirror real ones or hold nothing worth watching.
_SKIP_DISK_PREFIXES = ("loop", "ram", "zram", "dm-", "md", "sr", "nbd")


class Probe(Protocol):
    """A source of readings: `sample(dt)` returns what changed over the last `dt` seconds."""

    name: str

    def sample(self, dt: float) -> list[Sample]: ...

    def close(self) -> None: ...


def _rate(now: float, before: float, dt: float) -> float:
    """Per-second rate of a counter; a counter that went back (reset) counts as 0."""
    delta = now - before
    return delta / dt if delta > 0 and dt > 0 else 0.0


class CpuProbe:
    """Utilization of each logical CPU as `cpu.util` on chip `cpu:N` (0-100)."""

    name = "cpu"

    def __init__(self) -> None:
        self._last = psutil.cpu_times(percpu=True)

    def sample(self, dt: float) -> list[Sample]:
        now = psutil.cpu_times(percpu=True)
        out = []
        for i, (a, b) in enumerate(zip(self._last, now, strict=False)):
            total = _total(b) - _total(a)
            idle = _idle(b) - _idle(a)
            util = 100.0 * (total - idle) / total if total > 0 else 0.0
            out.append(Sample("cpu.util", min(100.0, max(0.0, util)), f"cpu:{i}", "cpu"))
        self._last = now
        return out

    def close(self) -> None:
        pass


class _CpuTimes(Protocol):
    """psutil's per-CPU times: a named tuple of seconds, fields varying by platform."""

    @property
    def idle(self) -> float: ...

    def __iter__(self) -> Iterator[float]: ...


def _total(t: _CpuTimes) -> float:
    # Linux counts guest time inside user/nice as well; psutil.cpu_percent drops it too.
    return sum(t) - getattr(t, "guest", 0.0) - getattr(t, "guest_nice", 0.0)


def _idle(t: _CpuTimes) -> float:
    return t.idle + getattr(t, "iowait", 0.0)


class MemoryProbe:
    """Host memory: `mem.used`, `mem.available` (bytes) and `mem.util` (percent)."""

    name = "memory"

    def sample(self, dt: float) -> list[Sample]:
        vm = psutil.virtual_memory()
        return [
            Sample("mem.used", vm.used, device="memory"),
            Sample("mem.available", vm.available, device="memory"),
            Sample("mem.util", vm.percent, device="memory"),
        ]

    def close(self) -> None:
        pass


def nic_indexes() -> dict[str, int]:
    """Interface name -> kernel interface index (the N of chip `nic:N`)."""
    try:
        return {name: index for index, name in socket.if_nameindex()}
    except OSError:
        return {}


class NicProbe:
    """Each network interface as chip `nic:IFINDEX`, its name in `device`.

    Readings: bytes received and sent since the last sample (`nic.rx_bytes`,
    `nic.tx_bytes`, so totals are a SUM) and the same as rates (`nic.*_bytes_per_s`).
    """

    name = "nic"

    def __init__(self) -> None:
        self._index = nic_indexes()
        self._last = psutil.net_io_counters(pernic=True)

    def _chip(self, name: str) -> str:
        index = self._index.get(name)
        if index is None:  # appeared after start, or no if_nameindex on this OS
            self._index = nic_indexes()
            index = self._index.get(name)
            if index is None:
                index = self._index[name] = 1000 + len(self._index)
        return f"nic:{index}"

    def sample(self, dt: float) -> list[Sample]:
        now = psutil.net_io_counters(pernic=True)
        out = []
        for name, b in now.items():
            a = self._last.get(name)
            if a is None:
                continue
            chip = self._chip(name)
            rx = max(0, b.bytes_recv - a.bytes_recv)
            tx = max(0, b.bytes_sent - a.bytes_sent)
            out += [
                Sample("nic.rx_bytes", rx, chip, "nic", name),
                Sample("nic.tx_bytes", tx, chip, "nic", name),
                Sample("nic.rx_bytes_per_s", rx / dt if dt > 0 else 0.0, chip, "nic", name),
                Sample("nic.tx_bytes_per_s", tx / dt if dt > 0 else 0.0, chip, "nic", name),
            ]
        self._last = now
        return out

    def close(self) -> None:
        pass


def whole_disks(names: list[str]) -> list[str]:
    """Drop partitions and virtual devices: keep what /sys/block lists (Linux), else all."""
    try:
        block = set(os.listdir("/sys/block"))
    except OSError:
        block = set(names)
    return sorted(n for n in names if n in block and not n.startswith(_SKIP_DISK_PREFIXES))


class DiskProbe:
    """Disk I/O per whole disk (`device` = its name): bytes/s, ops/s and busy percent."""

    name = "disk"

    def __init__(self) -> None:
        self._last = psutil.disk_io_counters(perdisk=True) or {}
        self._disks = whole_disks(list(self._last))

    def sample(self, dt: float) -> list[Sample]:
        now = psutil.disk_io_counters(perdisk=True) or {}
        out = []
        for name in self._disks:
            a, b = self._last.get(name), now.get(name)
            if a is None or b is None:
                continue
            out += [
                Sample("disk.read_bytes_per_s", _rate(b.read_bytes, a.read_bytes, dt), device=name),
                Sample(
                    "disk.write_bytes_per_s", _rate(b.write_bytes, a.write_bytes, dt), device=name
                ),
                Sample("disk.read_ops_per_s", _rate(b.read_count, a.read_count, dt), device=name),
                Sample(
                    "disk.write_ops_per_s", _rate(b.write_count, a.write_count, dt), device=name
                ),
            ]
            busy_ms = getattr(b, "busy_time", None)
            if busy_ms is not None:  # Linux and FreeBSD only
                busy = _rate(busy_ms, a.busy_time, dt) / 10.0  # ms per s -> percent
                out.append(Sample("disk.busy", min(100.0, busy), device=name))
        self._last = now
        return out

    def close(self) -> None:
        pass


class ProcessProbe:
    """A process and its descendants (the program `chiptrace record` runs), as `device`
    `pid:N`: `proc.cpu` (percent of one core, summed over the tree, so above 100 when it
    uses several), `proc.cpu_seconds` (CPU time in the interval: SUM gives the total) and
    `proc.rss` (resident bytes, summed).

    Descendants are looked for every `refresh_every` samples (listing them walks /proc,
    ~1 ms), and counted from when they are found.
    """

    name = "process"

    def __init__(self, pid: int, refresh_every: int = 10) -> None:
        self.pid = pid
        self.device = f"pid:{pid}"
        self.refresh_every = refresh_every
        self._root = psutil.Process(pid)
        self._procs: dict[int, psutil.Process] = {}
        self._cpu: dict[int, float] = {}
        self._n = 0
        self._refresh()

    def _refresh(self) -> None:
        try:
            found = [self._root, *self._root.children(recursive=True)]
        except psutil.Error:
            found = []
        for proc in found:
            if proc.pid not in self._procs:
                self._procs[proc.pid] = proc
                self._cpu[proc.pid] = _proc_cpu(proc) or 0.0  # count from here on

    def sample(self, dt: float) -> list[Sample]:
        self._n += 1
        if self._n % self.refresh_every == 0:
            self._refresh()
        cpu, rss = 0.0, 0
        for pid, proc in list(self._procs.items()):
            try:
                with proc.oneshot():
                    now, mem = _proc_cpu(proc), proc.memory_info().rss
            except psutil.Error:  # exited (its last slice is lost) or not ours to read
                now = None
            if now is None:
                del self._procs[pid]
                continue
            cpu += max(0.0, now - self._cpu[pid])
            self._cpu[pid] = now
            rss += mem
        if not self._procs:
            return []
        return [
            Sample("proc.cpu", 100.0 * cpu / dt if dt > 0 else 0.0, device=self.device),
            Sample("proc.cpu_seconds", cpu, device=self.device),
            Sample("proc.rss", rss, device=self.device),
        ]

    def close(self) -> None:
        pass


def _proc_cpu(proc: psutil.Process) -> float | None:
    # children_* fields count reaped children, which the tree already counts; leave them out
    t = proc.cpu_times()
    return t.user + t.system


def psutil_probes() -> list[Probe]:
    """The host probes that work here; one that fails to start is left out."""
    probes: list[Probe] = []
    for cls in (CpuProbe, MemoryProbe, NicProbe, DiskProbe):
        try:
            probes.append(cls())
        except Exception as e:  # noqa: BLE001 - a missing /proc file must not stop the others
            log.warning("chiptrace: host probe %s unavailable: %s", cls.name, e)
    return probes
