"""The cost model of a chip op: roofline time plus launch overhead, per precision."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from chiptrace.emulator.efficiency import Efficiency
from chiptrace.emulator.errors import WorkloadError
from chiptrace.emulator.topology_files import ChipSpec

# When a chip lacks a precision it runs the op in the next one it has (an A100 has no fp8:
# fp8 work runs in bf16), which is what a framework's autocast falls back to.
FALLBACK = {
    "nvfp4": ("nvfp4", "fp8", "bf16", "fp16", "fp32"),
    "fp8": ("fp8", "bf16", "fp16", "fp32"),
    "int8": ("int8", "fp8", "bf16", "fp16", "fp32"),
    "bf16": ("bf16", "fp16", "fp32"),
    "fp16": ("fp16", "bf16", "fp32"),
    "fp32": ("fp32",),
}
BYTES = {
    "fp32": 4.0,
    "bf16": 2.0,
    "fp16": 2.0,
    "fp8": 1.0,
    "int8": 1.0,
    "nvfp4": 0.5625,
}  # nvfp4: 4 bits + an fp8 scale per 16


def resolve_precision(chip: ChipSpec, precision: str) -> str:
    """The precision `chip` actually runs `precision` work in.

    Raises:
        WorkloadError: the chip has no compute peak at all (a NIC or switch).
    """
    for p in FALLBACK[precision]:
        if p in chip.peak_flops:
            return p
    raise WorkloadError(
        f"{chip.id} ({chip.model}) has no peak_tflops for {precision} or a wider precision"
    )


def roofline_ns(
    chip: ChipSpec, flops: Any, nbytes: Any, precision: str, slow: float = 1.0, eff: float = 1.0
) -> np.ndarray:
    """Op time in ns: max(flops / peak, bytes / memory bandwidth) / eff * slow + launch
    overhead, `eff` the fraction of its roofline the op's kernels reach (efficiency.py)."""
    peak = chip.peak_flops[precision]
    mem = chip.memory_bandwidth or np.inf
    t = np.maximum(
        np.asarray(flops, dtype=np.float64) / peak, np.asarray(nbytes, dtype=np.float64) / mem
    )
    return t / eff * 1e9 * slow + chip.launch_overhead_ns


def op_ns(
    chip: ChipSpec,
    parts: Sequence[tuple[str, float, float]],
    precision: str,
    eff: Efficiency,
    slow: float = 1.0,
) -> float:
    """Time in ns of one op made of kernels of several classes, (class, flops, bytes) each:
    the sum of their rooflines at their classes' efficiencies, plus one launch overhead."""
    t = sum(
        float(roofline_ns(chip, f, b, precision, slow, eff.of(chip.efficiency, cls, precision)))
        - chip.launch_overhead_ns
        for cls, f, b in parts
    )
    return t + chip.launch_overhead_ns
