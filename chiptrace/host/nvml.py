"""NVIDIA GPUs through NVML (`nvidia-ml-py`, imported only here and only when sampling).

Each GPU is chip `gpu:N` (its NVML index), its product name in `device`. Readings:
utilization, memory, power, temperature, and PCIe and NVLink throughput from NVML's
cumulative byte counters (field values), turned into rates between samples. A reading a
GPU or driver does not support is tried once and then left out for that GPU.

Where the library, the driver or a GPU is missing, `open_nvml()` returns no probe and a
one-line reason; the sampler logs it once and samples the rest of the host.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

from chiptrace.host.metrics import Sample

log = logging.getLogger("chiptrace")

# Field ids from nvml.h, spelled out so a pynvml without the constant still works.
_FI_NVLINK_DATA_TX = 138  # KiB, cumulative, per link (scopeId = link)
_FI_NVLINK_DATA_RX = 139
_FI_PCIE_TX_BYTES = 197  # bytes, cumulative (Hopper and newer drivers)
_FI_PCIE_RX_BYTES = 198
_PCIE_FALLBACK_PERIOD_S = 1.0  # nvmlDeviceGetPcieThroughput sleeps ~20 ms per call
_MAX_NVLINKS = 18


@dataclass
class _Gpu:
    index: int
    handle: Any
    name: str
    links: list[int] = field(default_factory=list)
    off: set[str] = field(default_factory=set)  # readings that failed once
    counters: dict[str, float] = field(default_factory=dict)
    pcie_due: float = 0.0

    @property
    def chip(self) -> str:
        return f"gpu:{self.index}"


def open_nvml() -> tuple[NvmlProbe | None, str]:
    """Start NVML and find the GPUs.

    Returns:
        (probe, status): the probe is None where there is no library, driver or GPU, and
        status says which, in one line.
    """
    try:
        import pynvml
    except ImportError:
        return None, "no NVML: nvidia-ml-py is not installed"
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as e:
        return None, f"no NVML: {e}"
    try:
        count = pynvml.nvmlDeviceGetCount()
        gpus = [_open_gpu(pynvml, i) for i in range(count)]
        driver = _text(pynvml.nvmlSystemGetDriverVersion())
    except pynvml.NVMLError as e:
        pynvml.nvmlShutdown()
        return None, f"no NVML: {e}"
    if not gpus:
        pynvml.nvmlShutdown()
        return None, "no NVML GPU: NVML found 0 devices"
    return NvmlProbe(pynvml, gpus), f"NVML driver {driver}: {len(gpus)} GPU(s)"


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _open_gpu(nv: Any, index: int) -> _Gpu:
    handle = nv.nvmlDeviceGetHandleByIndex(index)
    gpu = _Gpu(index, handle, _text(nv.nvmlDeviceGetName(handle)))
    for link in range(_MAX_NVLINKS):
        try:
            if nv.nvmlDeviceGetNvLinkState(handle, link):
                gpu.links.append(link)
        except nv.NVMLError:
            break  # no NVLink, or no more links
    return gpu


# nvmlValueType_t -> the member of the nvmlValue_t union that holds the number
_VALUE_MEMBERS = {
    0: "dVal",
    1: "uiVal",
    2: "ulVal",
    3: "ullVal",
    4: "sllVal",
    5: "siVal",
    6: "usVal",
}


def field_value(v: Any) -> float | None:
    """The number in an nvmlFieldValue_t, or None when NVML reported an error for it."""
    member = _VALUE_MEMBERS.get(v.valueType)
    if v.nvmlReturn != 0 or member is None:
        return None
    return float(getattr(v.value, member))


def counter_rate(counters: dict[str, float], key: str, value: float, dt: float) -> float | None:
    """Rate of a cumulative counter since its last reading (None on the first reading)."""
    before = counters.get(key)
    counters[key] = value
    if before is None or dt <= 0:
        return None
    return max(0.0, value - before) / dt


class NvmlProbe:
    """Readings for every GPU NVML sees; see the module docstring for the metric names."""

    name = "nvml"

    def __init__(self, nv: Any, gpus: list[_Gpu]) -> None:
        self._nv = nv
        self.gpus = gpus

    def sample(self, dt: float) -> list[Sample]:
        out: list[Sample] = []
        for gpu in self.gpus:
            out += self._basic(gpu)
            out += self._counters(gpu, dt)
        return out

    def _read(self, gpu: _Gpu, what: str, fn: Any, *args: Any) -> Any:
        if what in gpu.off:
            return None
        try:
            return fn(gpu.handle, *args)
        except self._nv.NVMLError as e:
            gpu.off.add(what)
            log.info("chiptrace: %s %s: %s; not sampled", gpu.chip, what, e)
            return None

    def _basic(self, gpu: _Gpu) -> list[Sample]:
        nv, out = self._nv, []

        def add(metric: str, value: float) -> None:
            out.append(Sample(metric, value, gpu.chip, "gpu", gpu.name))

        util = self._read(gpu, "utilization", nv.nvmlDeviceGetUtilizationRates)
        if util is not None:
            add("gpu.util", util.gpu)
            add("gpu.mem_util", util.memory)
        mem = self._read(gpu, "memory", nv.nvmlDeviceGetMemoryInfo)
        if mem is not None:
            add("gpu.mem_used", mem.used)
            add("gpu.mem_total", mem.total)
        power = self._read(gpu, "power", nv.nvmlDeviceGetPowerUsage)
        if power is not None:
            add("gpu.power", power / 1000.0)  # NVML reports milliwatts
        temp = self._read(gpu, "temperature", nv.nvmlDeviceGetTemperature, 0)
        if temp is not None:
            add("gpu.temperature", temp)
        return out

    def _counters(self, gpu: _Gpu, dt: float) -> list[Sample]:
        fields = (
            [] if "pcie counters" in gpu.off else [(_FI_PCIE_TX_BYTES, 0), (_FI_PCIE_RX_BYTES, 0)]
        )
        if "nvlink counters" not in gpu.off:
            for link in gpu.links:
                fields += [(_FI_NVLINK_DATA_TX, link), (_FI_NVLINK_DATA_RX, link)]
        values = (
            self._read(gpu, "field values", self._nv.nvmlDeviceGetFieldValues, fields)
            if fields
            else None
        )
        totals: dict[str, float] = {}
        for v in values or []:
            x = field_value(v)
            fid = int(v.fieldId)
            if fid in (_FI_PCIE_TX_BYTES, _FI_PCIE_RX_BYTES):
                if x is None:
                    gpu.off.add("pcie counters")
                    continue
                key = "pcie.tx_bytes_per_s" if fid == _FI_PCIE_TX_BYTES else "pcie.rx_bytes_per_s"
                totals[key] = totals.get(key, 0.0) + x
            elif x is None:
                gpu.off.add("nvlink counters")
            else:
                key = (
                    "nvlink.tx_bytes_per_s"
                    if fid == _FI_NVLINK_DATA_TX
                    else "nvlink.rx_bytes_per_s"
                )
                totals[key] = totals.get(key, 0.0) + x * 1024.0  # KiB counters
        out = []
        for key, total in totals.items():
            rate = counter_rate(gpu.counters, key, total, dt)
            if rate is not None:
                out.append(Sample(key, rate, gpu.chip, "gpu", gpu.name))
        if "pcie counters" in gpu.off or "field values" in gpu.off:
            out += self._pcie_fallback(gpu)
        return out

    def _pcie_fallback(self, gpu: _Gpu) -> list[Sample]:
        """Older drivers: NVML's own 20 ms PCIe window, read at most once a second."""
        now = time.monotonic()
        if now < gpu.pcie_due:
            return []
        gpu.pcie_due = now + _PCIE_FALLBACK_PERIOD_S
        out = []
        for key, counter in (("pcie.tx_bytes_per_s", 0), ("pcie.rx_bytes_per_s", 1)):
            kbs = self._read(gpu, f"pcie {key}", self._nv.nvmlDeviceGetPcieThroughput, counter)
            if kbs is not None:
                out.append(Sample(key, kbs * 1024.0, gpu.chip, "gpu", gpu.name))
        return out

    def close(self) -> None:
        try:
            self._nv.nvmlShutdown()
        except self._nv.NVMLError:
            pass
