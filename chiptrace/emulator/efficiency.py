"""How close real kernels come to a chip's roofline, per op class and precision.

A chip model may declare, in its topology file, the fraction of its roofline each class of
op reaches, from published measurements (the presets cite theirs):

    [chip_models.B200.efficiency]
    gemm = { bf16 = 0.65, fp8 = 0.6 }   # per precision; "*" for the rest
    attention = 0.5                     # one figure for every precision
    comm = 0.8                          # collectives: the fraction of a link NCCL drives

Classes: `gemm` (matmuls: a layer's projections and MLP, prefill, decode), `attention`
(the fused attention kernel), `elementwise` (norms, activations, residuals, input
preprocessing: memory-bound), `optimizer` (the Adam update), `comm` (collective kernels:
the fraction of each link's bandwidth a collective's flows share, max-min fairly; other
transfers see the whole link: latency + bytes / fair share). A class a chip does not
declare runs at its roofline (1.0).

The run's `efficiency` knob picks what is applied: `preset` (the figures declared, the
default), `ideal` (every op at its roofline with the nominal work of the model, as before
efficiencies existed), or a number in (0, 1] for every class of every chip.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from chiptrace.emulator.errors import TopologyError, WorkloadError
from chiptrace.schema import PRECISIONS

OP_CLASSES = ("gemm", "attention", "elementwise", "optimizer", "comm")
MODES = ("preset", "ideal")


def parse_table(raw: Any, source: str, where: str) -> dict[str, dict[str, float]]:
    """A chip model's `efficiency` table as {class: {precision or "*": fraction}}.

    Raises:
        TopologyError: an unknown class or precision, or a fraction outside (0, 1].
    """
    if not isinstance(raw, Mapping):
        raise TopologyError(f"{source}: {where} must be a table of op class = fraction")
    out: dict[str, dict[str, float]] = {}
    for cls, value in raw.items():
        if cls not in OP_CLASSES:
            raise TopologyError(
                f"{source}: {where}.{cls}: unknown op class; expected one of {', '.join(OP_CLASSES)}"
            )
        items = value.items() if isinstance(value, Mapping) else [("*", value)]
        out[cls] = {}
        for prec, frac in items:
            if prec != "*" and prec not in PRECISIONS:
                raise TopologyError(
                    f"{source}: {where}.{cls}.{prec}: unknown precision; expected one of "
                    f"{', '.join(PRECISIONS)} or *"
                )
            ok = isinstance(frac, (int, float)) and not isinstance(frac, bool) and 0 < frac <= 1
            if not ok:
                key = f"{cls}.{prec}" if prec != "*" else cls
                raise TopologyError(
                    f"{source}: {where}.{key} = {frac!r}: expected a fraction in (0, 1]"
                )
            out[cls][prec] = float(frac)
    return out


def check_mode(value: str) -> str | float:
    """The `efficiency` knob as `preset`, `ideal` or a fraction.

    Raises:
        WorkloadError: anything else.
    """
    if value in MODES:
        return value
    try:
        frac = float(value)
    except ValueError:
        frac = -1.0
    if not 0 < frac <= 1:
        raise WorkloadError(
            f"workload efficiency = {value!r}: expected preset, ideal or a fraction in (0, 1]"
        )
    return frac


class Efficiency:
    """The fraction of its roofline an op reaches, under one `efficiency` knob value."""

    def __init__(self, mode: str = "preset") -> None:
        self.mode = check_mode(mode)

    @property
    def ideal(self) -> bool:
        """Ops at their roofline with the model's nominal work (no kernel mix)."""
        return self.mode == "ideal"

    def of(self, table: Mapping[str, Mapping[str, float]], op_class: str, precision: str) -> float:
        """The fraction for `op_class` in `precision` given a chip's efficiency table."""
        if isinstance(self.mode, float):
            return self.mode
        if self.mode == "ideal":
            return 1.0
        per = table.get(op_class, {})
        return per.get(precision, per.get("*", 1.0))
