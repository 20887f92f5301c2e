"""Inference serving (placeholder until the full model lands)."""

from __future__ import annotations

from dataclasses import dataclass

from chiptrace.emulator.errors import WorkloadError


@dataclass
class InferConfig:
    """Knobs of the inference workload."""

    rate: float = 2000.0


class Inference:
    def __init__(self, ctx, cfg) -> None:  # noqa: ANN001
        raise WorkloadError("workload 'infer' is not implemented yet")
