"""The raw Kineto JSON read the plain way, for tests that check the report's figures
against values computed here, without chiptrace's tables: exact ns times (Decimal), the
profiler steps per file, and each device event with the runtime call that launched it
(same `correlation`) and the step that call (else the event's start) falls in."""

from __future__ import annotations

import bisect
import gzip
import json
import re
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path

DEVICE_CATS = {"kernel": None, "gpu_memcpy": "memcpy", "gpu_memset": "memset"}
_STEP = re.compile(r"^ProfilerStep#\d+$")


def ns(us: int | Decimal) -> int:
    return int(Decimal(us) * 1000)


@dataclass
class Step:
    name: str
    start: int
    end: int


@dataclass
class Device:
    name: str
    kind: str  # compute, comm, memcpy, memset
    device: int
    stream: int
    start: int
    end: int
    launch_start: int | None
    launch_end: int | None
    step: str | None  # the step's name, where launched (or started) inside one


def load(path: Path) -> dict:
    with gzip.open(path, "rb") as fh:
        return json.load(fh, parse_float=Decimal)


def events(doc: dict) -> list[dict]:
    return doc["traceEvents"] if isinstance(doc, dict) else doc


def steps(doc: dict) -> list[Step]:
    """The host ProfilerStep#N annotations, by start."""
    out = [
        Step(e["name"], ns(e["ts"]), ns(e["ts"]) + ns(e["dur"]))
        for e in events(doc)
        if e.get("ph") == "X" and e.get("cat") == "user_annotation" and _STEP.match(e["name"])
    ]
    return sorted(out, key=lambda s: s.start)


def _kind(e: dict) -> str:
    fixed = DEVICE_CATS[e["cat"]]
    if fixed:
        return fixed
    return "comm" if re.match(r"^(nccl|rccl)", e["name"]) else "compute"


def devices(doc: dict) -> list[Device]:
    """Kernels, copies and memsets with a duration, each with its launching call and step."""
    evs = [e for e in events(doc) if e.get("ph") == "X"]
    runtime = {
        e["args"]["correlation"]: e
        for e in evs
        if e.get("cat", "").endswith(("_runtime", "_driver")) and "correlation" in e.get("args", {})
    }
    st = steps(doc)

    def step_at(t: int) -> str | None:
        inside = [s for s in st if s.start <= t < s.end]
        return inside[-1].name if inside else None

    out = []
    for e in evs:
        if e.get("cat") not in DEVICE_CATS or not e.get("dur"):
            continue
        call = runtime.get(e.get("args", {}).get("correlation"))
        ls = None if call is None else ns(call["ts"])
        le = None if call is None else ls + ns(call["dur"])
        start = ns(e["ts"])
        out.append(
            Device(
                e["name"],
                _kind(e),
                int(e["args"].get("device", e.get("pid", 0))),
                int(e["args"].get("stream", e.get("tid", 0))),
                start,
                start + ns(e["dur"]),
                ls,
                le,
                step_at(ls if ls is not None else start),
            )
        )
    return out


def union(iv: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[list[int]] = []
    for s, e in sorted(i for i in iv if i[1] > i[0]):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return [(s, e) for s, e in out]


def length(iv: list[tuple[int, int]]) -> int:
    return sum(e - s for s, e in iv)


def _inside(iv: list[tuple[int, int]], starts: list[int], t: float) -> bool:
    i = bisect.bisect_right(starts, t) - 1
    return i >= 0 and t < iv[i][1]


def minus(a: list[tuple[int, int]], b: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """a minus b, both unions: the elementary pieces between all boundaries that lie in a
    and not in b (a sweep of its own, not chiptrace's interval code)."""
    points = sorted({p for iv in (a, b) for se in iv for p in se})
    sa, sb = [s for s, _ in a], [s for s, _ in b]
    out = []
    for lo, hi in zip(points, points[1:], strict=False):
        mid = (lo + hi) / 2
        if _inside(a, sa, mid) and not _inside(b, sb, mid):
            out.append((lo, hi))
    return union(out)
