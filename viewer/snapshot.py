"""What one dashboard refresh draws: plain dataclasses the live model fills in."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass(frozen=True, slots=True)
class SeriesRow:
    """One chip or link in a snapshot: utilization over the window and its history."""

    id: str
    type: str
    utilization: float
    history: np.ndarray  # fractions per history cell, oldest first; NaN before the data
    bytes_per_s: float = 0.0
    bandwidth: float | None = None
    src: str | None = None
    dst: str | None = None

    @property
    def saturation(self) -> float | None:
        """Throughput over bandwidth, when the topology gave a bandwidth."""
        return self.bytes_per_s / self.bandwidth if self.bandwidth else None


@dataclass(frozen=True, slots=True)
class SlowSpan:
    """One of the slowest spans that ended inside the window."""

    name: str
    where: str
    duration_ns: int
    end_ns: int


@dataclass(frozen=True, slots=True)
class Snapshot:
    """What the dashboard draws, computed from the window's buckets only."""

    since_ns: int
    until_ns: int
    window_ns: int
    chips: dict[str, list[SeriesRow]]
    links: list[SeriesRow]
    slowest: list[SlowSpan]
    spans_total: int
    spans_per_s: float
    dropped: int
    head_ns: int
    unread: int = 0  # spans the sources hold and have not sent yet (a store being read)
    loading: bool = False  # the window starts late: spans not read yet reach into it
    covered: bool = True  # some of the window holds every span that touches it
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def empty(self) -> bool:
        """Nothing to show yet: no span, or none of the window complete."""
        return self.head_ns == 0 or not self.covered
