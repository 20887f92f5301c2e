"""Errors of the analysis: each is one line naming the option, the value and what was expected."""

from __future__ import annotations

from chiptrace.errors import ChiptraceError


class AnalysisError(ChiptraceError):
    """Root of the analysis' user-facing errors."""


class StepError(AnalysisError):
    """A `--step` pattern that matches no span of the trace."""
