"""NVML: degrades to a one-line 'no NVML' where there is no library, driver or GPU; real
figures where there is a GPU (that test skips elsewhere)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from chiptrace.host import HostSampler
from chiptrace.host.nvml import counter_rate, open_nvml
from tests.host.conftest import metric_rows
from tests.waiting import wait_until


def _nvml_gpu_present() -> bool:
    probe, _ = open_nvml()
    if probe is None:
        return False
    probe.close()
    return True


HAVE_GPU = _nvml_gpu_present()


def _sample_briefly(directory: Path, **kwargs) -> HostSampler:
    s = HostSampler(directory, interval=0.02, **kwargs).start()
    assert s.wait_ready()
    wait_until(lambda: s.ticks >= 5, "five samples")
    s.stop()
    return s


@pytest.mark.skipif(HAVE_GPU, reason="NVML finds a GPU here; this checks the path without one")
def test_without_nvml_says_so_once_and_samples_cpus(tmp_path: Path, chiptrace_log) -> None:
    s = _sample_briefly(tmp_path)
    assert s.nvml_status.startswith("no NVML")
    said = [m for m in chiptrace_log.messages() if "NVML" in m]
    assert len(said) == 1, said
    assert "GPU metrics off" in said[0]
    assert s.ticks >= 5
    rows = metric_rows(tmp_path)
    assert any(r["metric"] == "cpu.util" for r in rows)
    assert not any(r["chip_type"] == "gpu" for r in rows)
    manifest = (tmp_path / "manifest").glob("*.json")
    assert any("no NVML" in p.read_text() for p in manifest)


def test_without_the_nvml_package_says_so_once(tmp_path: Path, chiptrace_log, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # `import pynvml` raises ImportError
    s = _sample_briefly(tmp_path)
    assert s.nvml_status == "no NVML: nvidia-ml-py is not installed"
    assert len([m for m in chiptrace_log.messages() if "NVML" in m]) == 1
    assert any(r["metric"] == "cpu.util" for r in metric_rows(tmp_path))


def test_nvml_off_is_silent(tmp_path: Path, chiptrace_log) -> None:
    s = _sample_briefly(tmp_path, nvml=False)
    assert s.nvml_status == "off"
    assert not [m for m in chiptrace_log.messages() if "NVML" in m]


def test_counter_rate_needs_two_readings_and_ignores_resets() -> None:
    c: dict[str, float] = {}
    assert counter_rate(c, "pcie", 1000.0, 0.1) is None
    assert counter_rate(c, "pcie", 3000.0, 0.1) == pytest.approx(20_000.0)
    assert counter_rate(c, "pcie", 10.0, 0.1) == 0.0  # the counter went back (driver reload)


@pytest.mark.skipif(not HAVE_GPU, reason="needs NVML and an NVIDIA GPU")
def test_real_gpu_figures(tmp_path: Path) -> None:
    import pynvml

    s = _sample_briefly(tmp_path)
    assert s.nvml_status.startswith("NVML driver")
    rows = metric_rows(tmp_path, "chip_type = 'gpu'")
    pynvml.nvmlInit()
    try:
        count = pynvml.nvmlDeviceGetCount()
        total0 = pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(0)).total
    finally:
        pynvml.nvmlShutdown()
    assert {r["chip_id"] for r in rows} == {f"gpu:{i}" for i in range(count)}
    by = {(r["chip_id"], r["metric"]): r["value"] for r in rows}
    assert 0 <= by[("gpu:0", "gpu.util")] <= 100
    assert by[("gpu:0", "gpu.mem_total")] == total0
    assert 0 < by[("gpu:0", "gpu.mem_used")] <= total0
    if ("gpu:0", "gpu.power") in by:
        assert 1 < by[("gpu:0", "gpu.power")] < 5000  # watts, not milliwatts
    pcie = [r for r in rows if r["metric"].startswith("pcie.")]
    assert all(r["value"] >= 0 for r in pcie)
