"""Benchmark figures: printed beside their peer and target, and saved for the README table.

Each benchmark collects `Figure`s and calls `save(name, figures)`, which writes
benchmarks/results/<name>.json; benchmarks/_table.py renders every results file into
README.md between `<!-- bench:start -->` and `<!-- bench:end -->` (`make bench`).
A figure that misses its target says MISSED, in the printout and in the table.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
from dataclasses import asdict, dataclass
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


@dataclass
class Figure:
    """One measured figure. `target` reads like "<= 1.0" or ">= 20"; `of` says which of
    chiptrace's value or the ratio the target applies to."""

    figure: str
    unit: str
    chiptrace: float
    peer: float | None = None
    peer_name: str = ""
    target: str = ""
    of: str = "chiptrace"  # or "ratio"
    better: str = "lower"  # "higher" for rates: the ratio is then chiptrace / peer

    @property
    def ratio(self) -> float | None:
        """How many times better chiptrace did than the peer (> 1: better)."""
        if self.peer is None or not self.chiptrace or not self.peer:
            return None
        if self.better == "higher":
            return self.chiptrace / self.peer
        return self.peer / self.chiptrace

    @property
    def met(self) -> bool | None:
        if not self.target:
            return None
        op, _, bound = self.target.partition(" ")
        value = self.ratio if self.of == "ratio" else self.chiptrace
        if value is None:
            return None
        return value <= float(bound) if op == "<=" else value >= float(bound)

    def line(self) -> str:
        peer = f"{self.peer_name} {self.peer:9.3f} {self.unit}" if self.peer is not None else ""
        ratio = f"{self.ratio:7.1f}x" if self.ratio is not None else ""
        verdict = {True: "met", False: "MISSED", None: ""}[self.met]
        target = f"target {self.of if self.of == 'ratio' else ''} {self.target}".replace("  ", " ")
        return (
            f"  {self.figure:48s} {self.chiptrace:9.3f} {self.unit:3s} {peer:28s} {ratio:9s}"
            f" {target if self.target else '':18s} {verdict}"
        )


def machine() -> str:
    """CPU count, model and load: figures from a loaded machine say so."""
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return f"{os.cpu_count()} CPUs ({model}), load {load:.1f}, Python {platform.python_version()}"


def save(name: str, figures: list[Figure], mode: str = "") -> Path:
    """Write benchmarks/results/<name>.json."""
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"{name}.json"
    doc = {
        "benchmark": name,
        "mode": mode,
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": machine(),
        "figures": [{**asdict(f), "ratio": f.ratio, "met": f.met} for f in figures],
    }
    out.write_text(json.dumps(doc, indent=1) + "\n")
    return out
