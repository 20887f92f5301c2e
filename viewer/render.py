"""Text drawing helpers shared by the widgets: bars, sparklines, units (pure functions).

Colours are Textual theme variables (`$success`, `$warning`, `$error`, `$text-muted`) in
content markup, so the same text reads on dark and light themes.
"""

from __future__ import annotations

import math

import numpy as np

_SPARK = "▁▂▃▄▅▆▇█"
_EIGHTHS = " ▏▎▍▌▋▊▉"


def level_style(fraction: float, warn: float = 0.6, hot: float = 0.9) -> str:
    """Theme colour for a load fraction: calm, busy, saturated."""
    if fraction >= hot:
        return "$error"
    if fraction >= warn:
        return "$warning"
    return "$success"


def bar(fraction: float, width: int) -> str:
    """A horizontal bar in eighth-cell steps, as markup coloured by load."""
    width = max(1, width)
    f = 0.0 if not math.isfinite(fraction) else min(max(fraction, 0.0), 1.0)
    eighths = int(round(f * width * 8))
    full, part = divmod(eighths, 8)
    body = "█" * full + (_EIGHTHS[part] if part and full < width else "")
    rest = "·" * (width - len(body))
    return f"[{level_style(f)}]{body}[/][$text-muted]{rest}[/]"


def sparkline(values: np.ndarray, width: int) -> str:
    """The last `width` fractions (0..1) as block characters; NaN (no data yet) is blank."""
    vals = np.asarray(values, dtype=float)[-max(width, 1) :]
    chars = [" " if not np.isfinite(v) else _SPARK[int(round(min(max(v, 0), 1) * 7))] for v in vals]
    text = "".join(chars).rjust(width)
    return f"[$accent]{text}[/]"


def percent(fraction: float) -> str:
    return f"{fraction * 100:3.0f}%" if math.isfinite(fraction) else "  -%"


def human_bytes_per_s(bps: float) -> str:
    """1.8 TB/s, 64.0 GB/s, 12 MB/s."""
    for unit, scale in (("TB/s", 1e12), ("GB/s", 1e9), ("MB/s", 1e6), ("kB/s", 1e3)):
        if bps >= scale:
            return f"{bps / scale:5.1f} {unit}"
    return f"{bps:5.0f}  B/s"


def human_ns(ns: float) -> str:
    """12.3 ms, 850 us, 2.10 s."""
    if ns >= 1e9:
        return f"{ns / 1e9:.2f} s"
    if ns >= 1e6:
        return f"{ns / 1e6:.1f} ms"
    if ns >= 1e3:
        return f"{ns / 1e3:.0f} µs"
    return f"{ns:.0f} ns"


def human_count(n: float) -> str:
    for unit, scale in (("M", 1e6), ("k", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f}{unit}"
    return f"{n:.0f}"
