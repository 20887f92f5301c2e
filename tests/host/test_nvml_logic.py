"""The NVML probe's own logic (field values, counters to rates, unsupported readings, the
PCIe fallback) against a stand-in `pynvml`: this machine has no NVIDIA driver, so without
one these lines would run only on GPU hosts. test_nvml.py checks the real library."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from chiptrace.host import HostSampler
from chiptrace.host import nvml as nvml_module
from chiptrace.host.nvml import open_nvml
from tests.host.conftest import metric_rows
from tests.waiting import wait_until


class NVMLError(Exception):
    pass


class FakeNvml:
    """Two GPUs: gpu:0 with PCIe and NVLink byte counters (2 links), gpu:1 with neither
    counter (an older driver: PCIe from the 20 ms throughput call), no temperature sensors."""

    NVMLError = NVMLError

    def __init__(self) -> None:
        self.clock = 0.0  # seconds on the fake's own clock: counters grow with it, not wall time
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
        elapsed = self.clock
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


def test_counters_become_rates_and_the_fallback_is_rate_limited(
    fake: FakeNvml, monkeypatch
) -> None:
    # The probe on its own, its clock the fake's: rates are exact, whatever the machine's load.
    monkeypatch.setattr(nvml_module, "time", SimpleNamespace(monotonic=lambda: fake.clock))
    probe, _ = open_nvml()
    by: dict[tuple[str, str], list[float]] = {}
    for _ in range(12):  # 12 readings 0.25 s apart on the fake clock: 3 s
        for r in probe.sample(0.25):
            by.setdefault((r.chip_id, r.metric), []).append(r.value)
        fake.clock += 0.25
    # counters become rates: the first reading gives none, then 1 GB/s and 2 x 10 MiB/s
    assert by[("gpu:0", "pcie.tx_bytes_per_s")] == [pytest.approx(1e9)] * 11
    assert by[("gpu:0", "nvlink.rx_bytes_per_s")] == [pytest.approx(2 * 10 * 2**20)] * 11
    # gpu:1 has no counters: PCIe from the throughput call, at most once a second, no NVLink
    assert by[("gpu:1", "pcie.rx_bytes_per_s")] == [2_000 * 1024.0] * 3  # at 0, 1 and 2 s
    assert ("gpu:1", "nvlink.tx_bytes_per_s") not in by
    assert set(by[("gpu:0", "gpu.util")]) == {75.0}
    assert set(by[("gpu:1", "gpu.power")]) == {350.0}  # watts
    assert set(by[("gpu:0", "gpu.mem_total")]) == {141 * 2**30}
    assert fake.temperature_calls == 2  # once per GPU, then left out
    assert ("gpu:0", "gpu.temperature") not in by
    probe.close()


def test_sampler_stores_nvml_figures(fake: FakeNvml, tmp_path: Path, chiptrace_log) -> None:
    with HostSampler(tmp_path, interval=0.02) as s:
        assert s.wait_ready()
        wait_until(lambda: s.ticks >= 5, "five samples")
    assert s.nvml_status.startswith("NVML driver")
    assert not [m for m in chiptrace_log.messages() if "NVML" in m]  # nothing to warn about
    rows = metric_rows(tmp_path, "chip_type = 'gpu'")
    assert {(r["device"], r["source"]) for r in rows} == {("Fake H200", "real")}
    util = {(r["chip_id"], r["value"]) for r in rows if r["metric"] == "gpu.util"}
    assert util == {("gpu:0", 75.0), ("gpu:1", 75.0)}
    assert fake.temperature_calls == 2
    assert fake.shutdowns == 1
