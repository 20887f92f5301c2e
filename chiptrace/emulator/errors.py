"""Errors of the emulated rack: each is one line naming the file, field and value."""

from __future__ import annotations

from chiptrace.errors import ChiptraceError


class EmulatorError(ChiptraceError):
    """Root of the emulator's user-facing errors."""


class TopologyError(EmulatorError):
    """A topology file or preset that is malformed: unknown types, missing chips, no route."""


class WorkloadError(EmulatorError):
    """A workload knob with a bad value, or a workload that does not fit the rack."""


class FaultError(EmulatorError):
    """A malformed `--fault KIND:TARGET[:VALUE]` or one naming a chip or link not in the rack."""
