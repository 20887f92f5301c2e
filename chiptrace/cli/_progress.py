"""A one-line progress bar on stderr for long imports and reports: drawn only on a terminal.

`importing [#########        ]  31%  12/64 files  1.4M spans/s  ETA 0:42`. Piped or
redirected, it draws nothing (a log gets no carriage returns).
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

_WIDTH = 30


def _eta(seconds: float) -> str:
    s = int(seconds + 0.5)
    return (
        f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"
    )


def _rate(per_s: float) -> str:
    for scale, unit in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if per_s >= scale:
            return f"{per_s / scale:.1f}{unit}"
    return f"{per_s:.0f}"


class Bar:
    """Redrawn at most 10 times a second; `on` is False (and every call a no-op) off a tty."""

    def __init__(self, label: str, stream: TextIO | None = None) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.on = self.stream.isatty()
        self.label = label
        self._t0 = time.monotonic()
        self._last = 0.0
        self._drawn = 0

    def update(
        self,
        frac: float,
        *,
        done: int | None = None,
        total: int | None = None,
        unit: str = "files",
        spans: int | None = None,
    ) -> None:
        now = time.monotonic()
        if not self.on or (now - self._last < 0.1 and frac < 1.0):
            return
        self._last = now
        frac = min(max(frac, 0.0), 1.0)
        elapsed = now - self._t0
        line = f"{self.label} [{'#' * int(frac * _WIDTH):<{_WIDTH}}] {frac:4.0%}"
        if done is not None and total is not None:
            line += f"  {done}/{total} {unit}"
        if spans is not None and elapsed > 0:
            line += f"  {_rate(spans / elapsed)} spans/s"
        if 0.02 < frac < 1.0:
            line += f"  ETA {_eta(elapsed * (1 - frac) / frac)}"
        self.stream.write("\r" + line.ljust(self._drawn))
        self.stream.flush()
        self._drawn = len(line)

    def close(self) -> None:
        if self.on and self._drawn:
            self.stream.write("\r" + " " * self._drawn + "\r")
            self.stream.flush()
