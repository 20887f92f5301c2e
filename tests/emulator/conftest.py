"""Fixtures for emulator tests: tiny topologies written as TOML in tmp_path."""

from __future__ import annotations

from pathlib import Path

import pytest

TINY = """
name = "tiny"
[chip_models.G]
type = "gpu"
peak_tflops = { bf16 = 100, fp32 = 50 }
memory_GB = 80
memory_bandwidth_GBps = 2000
[[chips]]
model = "G"
count = 2
[[chips]]
type = "cpu"
peak_tflops = { fp32 = 1 }
memory_GB = 100
memory_bandwidth_GBps = 100
[[chips]]
type = "switch"
[[links]]
type = "{ltype}"
a = "gpu:0"
b = "cpu:0"
bandwidth_GBps = {bw}
[[links]]
type = "nvlink6"
a = "gpu:*"
b = "switch:0"
bandwidth_GBps = 1800
"""


def tiny_toml(ltype: str = "pcie4", bw: float = 32) -> str:
    return TINY.replace("{ltype}", ltype).replace("{bw}", str(bw))


@pytest.fixture
def make_tiny():
    """tiny_toml(link type, bandwidth GB/s) -> TOML text of a 2-GPU, 1-CPU, 1-switch rack."""
    return tiny_toml


@pytest.fixture
def tiny(tmp_path: Path) -> Path:
    path = tmp_path / "tiny.toml"
    path.write_text(tiny_toml())
    return path
