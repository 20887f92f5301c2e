"""The NVML probe's own logic (field values, counters to rates, unsupported readings, the
PCIe fallback) against a stand-in `pynvml`: this machine has no NVIDIA driver, so without
one these lines would run only on GPU hosts. test_nvml.py checks the real library."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from chiptrace.host import HostSampler
from chiptrace.host.nvml import open_nvml
from tests.host.conftest import metric_rows


class NVMLError(Exception):
    pass


class FakeNvml:
    """Two GPUs: gpu:0 with PCIe and NVLink byte counters (2 links), gpu:1 with neither
    counter (an older driver: PCIe from the 20 ms throughput call), no temperature sensors."""

    NVMLError = NVMLError

    def __init__(self) -> None:
        self.t0 = time.monotonic()
        self.shutdowns = 0
        self.temperature_calls = 0

    def nvmlInit(self) -> None: ...

    def nvmlShutdown(self) -> None:
        self.shutdowns += 1

    def nvmlDeviceGetCount(self) -> int:
        return 2

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetName(self, h: int) -> bytes:
        return b"Fake H200"

    def nvmlSystemGetDriverVersion(self) -> str:
        return "999.1"

    def nvmlDeviceGetNvLinkState(self, h: int, link: int) -> int:
        if h == 1 or link >= 2:
            raise NVMLError("Not Supported")
        return 1

    def nvmlDeviceGetUtilizationRates(self, h: int) -> SimpleNamespace:
        return SimpleNamespace(gpu=75, memory=40)

    def nvmlDeviceGetMemoryInfo(self, h: int) -> SimpleNamespace:
        return SimpleNamespace(used=10 * 2**30, total=141 * 2**30)

    def nvmlDeviceGetPowerUsage(self, h: int) -> int:
        return 350_000  # mW

    def nvmlDeviceGetTemperature(self, h: int, sensor: int) -> int:
        self.temperature_calls += 1
        raise NVMLError("Not Supported")

    def nvmlDeviceGetPcieThroughput(self, h: int, counter: int) -> int:
        return 2_000  # KB/s

    def nvmlDeviceGetFieldValues(self, h: int, fields: list[tuple[int, int]]) -> list:
        elapsed = time.monotonic() - self.t0
        out = []
        for fid, _link in fields:
            if h == 1:  # no counters on this one
                out.append(SimpleNamespace(fieldId=fid, nvmlReturn=3, valueType=3, value=None))
                continue
            # PCIe: 1 GB/s each way; NVLink: 10 MiB/s per link, in KiB
            rate = 1e9 if fid in (197, 198) else 10 * 1024
            value = SimpleNamespace(ullVal=int(rate * elapsed))
            out.append(SimpleNamespace(fieldId=fid, nvmlReturn=0, valueType=3, value=value))
        return out


@pytest.fixture
def fake(monkeypatch) -> FakeNvml:
    nv = FakeNvml()
    monkeypatch.setitem(sys.modules, "pynvml", nv)
    return nv


def test_open_reports_driver_and_gpus(fake: FakeNvml) -> None:
    probe, status = open_nvml()
    assert status == "NVML driver 999.1: 2 GPU(s)"
    assert [g.links for g in probe.gpus] == [[0, 1], []]
    probe.close()
    assert fake.shutdowns == 1


def test_figures_rates_and_fallbacks(fake: FakeNvml, tmp_path: Path, chiptrace_log) -> None:
    with HostSampler(tmp_path, interval=0.05) as s:
        assert s.wait_ready()
        time.sleep(0.6)
    assert s.nvml_status.startswith("NVML driver")
    assert not [m for m in chiptrace_log.messages() if "NVML" in m]  # nothing to warn about
    rows = metric_rows(tmp_path, "chip_type = 'gpu'")
    by: dict[tuple[str, str], list[float]] = {}
    for r in rows:
        by.setdefault((r["chip_id"], r["metric"]), []).append(r["value"])
        assert r["device"] == "Fake H200" and r["source"] == "real"
    assert set(by[("gpu:0", "gpu.util")]) == {75.0}
    assert set(by[("gpu:1", "gpu.power")]) == {350.0}  # watts
    assert set(by[("gpu:0", "gpu.mem_total")]) == {141 * 2**30}
    assert fake.temperature_calls == 2  # once per GPU, then left out
    assert ("gpu:0", "gpu.temperature") not in by
    # counters become rates: the first reading gives none, then ~1 GB/s and 2 x 10 MiB/s
    pcie = by[("gpu:0", "pcie.tx_bytes_per_s")]
    assert len(pcie) >= 3 and all(0.5e9 < v < 2e9 for v in pcie)
    nvlink = by[("gpu:0", "nvlink.rx_bytes_per_s")]
    assert all(10e6 < v < 80e6 for v in nvlink)
    # gpu:1 has no counters: PCIe from the throughput call, at most once a second, no NVLink
    fallback = by[("gpu:1", "pcie.rx_bytes_per_s")]
    assert set(fallback) == {2_000 * 1024.0} and len(fallback) < len(pcie)  # rate-limited
    assert ("gpu:1", "nvlink.tx_bytes_per_s") not in by
    assert fake.shutdowns == 1
