"""`chiptrace import` beside HolisticTraceAnalysis loading the same Kineto file.

Both run as fresh Python processes (start-up included): wall time, CPU time (the process
and its workers) and peak memory (the summed RSS of the process and its workers, sampled),
and the ratios. Files: synthetic Kineto traces of --sizes-mb (default ~100k events and
~1 GB) made from the nccl_data fixture's events: its steps repeated with shifted times,
step numbers, correlations and flow ids. No fixture holds 100k events.

    python benchmarks/bench_import.py [--sizes-mb 26,1024] [--no-hta] [--keep DIR]

Needs `pip install -e '.[hta]'` for the HTA side.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

FIXTURES = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "kineto"
HTA = "from hta.trace_analysis import TraceAnalysis; TraceAnalysis(trace_dir={d!r})"


_SLOTS = re.compile(r'"\\u0001(ts|corr|id)\\u0001"|\\u0001(step)\\u0001')


def _template(e: dict) -> tuple[list[str], list[str]]:
    """An event's JSON text cut where copies differ (ts, step number, correlation, flow
    id): the pieces between, and what goes in each cut."""
    e2 = dict(e, ts="\u0001ts\u0001")
    if e2.get("ph") == "X" and "ProfilerStep#" in e2["name"]:
        e2["name"] = "ProfilerStep#\u0001step\u0001"
    if "args" in e2 and "correlation" in e2["args"]:
        e2["args"] = dict(e2["args"], correlation="\u0001corr\u0001")
    if e2.get("ph") in ("s", "f"):
        e2["id"] = "\u0001id\u0001"
    text = json.dumps(e2)
    pieces, kinds, at = [], [], 0
    for m in _SLOTS.finditer(text):
        pieces.append(text[at : m.start()])
        kinds.append(m.group(1) or m.group(2))
        at = m.end()
    pieces.append(text[at:])
    return pieces, kinds


def render_copy(
    events: list[dict],
    templates: list[tuple[list[str], list[str]]],
    c: int,
    shift: float,
    extra: int,
) -> list[str]:
    """Copy `c` of the events, as JSON text from their templates: times shifted by `shift`
    us, step numbers by 10 a copy, correlation and flow ids by `extra`."""
    out = []
    for e, (pieces, kinds) in zip(events, templates, strict=True):
        values = {
            "ts": repr(round(e["ts"] + shift, 3)),
            "step": str(c * 10 + int(e["name"].split("#")[1])) if "step" in kinds else "",
            "corr": str(e["args"]["correlation"] + extra) if "corr" in kinds else "",
            "id": str(e["id"] + extra) if "id" in kinds else "",
        }
        text = [pieces[0]]
        for kind, piece in zip(kinds, pieces[1:], strict=True):
            text += (values[kind], piece)
        out.append("".join(text))
    return out


def synthesize(path: Path, size_mb: int) -> int:
    """A Kineto trace of about size_mb MB from nccl_data's events, copied with shifted times,
    step numbers, correlation and flow ids; returns its events."""
    doc = json.load(gzip.open(FIXTURES / "nccl_data.json.gz"))
    events = [e for e in doc.pop("traceEvents") if e.get("ph") in ("X", "s", "f")]
    t0 = min(e["ts"] for e in events)
    span = max(e["ts"] + e.get("dur", 0) for e in events) - t0 + 1000.0
    templates = [_template(e) for e in events]
    per_copy = sum(len(json.dumps(e)) + 2 for e in events)
    copies = max(1, size_mb * 1_000_000 // per_copy)
    n = 0
    with open(path, "w") as fh:
        head = {k: v for k, v in doc.items() if k not in ("traceName", "baseTimeNanoseconds")}
        fh.write(json.dumps(head)[:-1] + ', "traceEvents": [\n')
        for c in range(copies):
            shift, extra = c * span, c * 1_000_000
            out = render_copy(events, templates, c, shift, extra)
            fh.write(("" if n == 0 else ",\n") + ",\n".join(out))
            n += len(out)
        fh.write(f'\n], "baseTimeNanoseconds": {doc.get("baseTimeNanoseconds", 0)}}}\n')
    return n


def _tree_rss(root: int) -> int:
    """Resident bytes of a process and all its descendants (workers included), from /proc."""
    parent: dict[int, int] = {}
    rss: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parent[int(entry)] = int(fields[1])
        rss[int(entry)] = int(fields[21]) * os.sysconf("SC_PAGE_SIZE")
    tree, todo = set(), [root]
    while todo:
        pid = todo.pop()
        tree.add(pid)
        todo += [c for c, p in parent.items() if p == pid and c not in tree]
    return sum(rss.get(p, 0) for p in tree)


@dataclass
class Run:
    wall_s: float
    cpu_s: float  # user + system, the process and the children it waited for
    rss_mib: float  # peak of the summed RSS of the process tree, sampled every 50 ms


def measure(cmd: list[str]) -> Run:
    """Wall time, CPU time and peak RSS (of the whole process tree) of a child process."""
    with tempfile.TemporaryFile() as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err)
        peak = 0
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            peak = max(peak, _tree_rss(proc.pid))
            time.sleep(0.05)
        dt = time.perf_counter() - t0
        if os.waitstatus_to_exitcode(status) != 0:
            err.seek(0)
            raise SystemExit(f"failed: {' '.join(cmd)}: {err.read().decode()[-500:]}")
    # ru_maxrss (the largest single process) is a floor for the tree's peak.
    peak = max(peak, usage.ru_maxrss * 1024)
    return Run(dt, usage.ru_utime + usage.ru_stime, peak / 2**20)


def compare(label: str, trace: Path, events: int, hta: bool, work: Path, extra: list[str]) -> None:
    out = work / f"out-{label}"
    shutil.rmtree(out, ignore_errors=True)
    exe = [sys.executable, "-m", "chiptrace", "import", str(trace), "--out", str(out), *extra]
    c = measure(exe)
    shutil.rmtree(out, ignore_errors=True)
    print(
        f"{label}: {events:,} events\n"
        f"  chiptrace import    {c.wall_s:7.2f} s wall {c.cpu_s:7.2f} s CPU {c.rss_mib:6.0f} MiB"
        f"  {events / c.wall_s / 1e3:5.0f}k events/s ({events / c.cpu_s / 1e3:.0f}k per CPU second)",
        flush=True,
    )
    if not hta:
        return
    folder = work / f"hta-{label}"
    folder.mkdir(exist_ok=True)
    link = folder / trace.name
    if not link.exists():
        link.symlink_to(trace.resolve())
    h = measure([sys.executable, "-c", HTA.format(d=str(folder))])
    print(
        f"  HTA TraceAnalysis   {h.wall_s:7.2f} s wall {h.cpu_s:7.2f} s CPU {h.rss_mib:6.0f} MiB\n"
        f"  chiptrace: {h.wall_s / c.wall_s:.1f}x faster (wall), {h.cpu_s / c.cpu_s:.1f}x less CPU, "
        f"{c.rss_mib / h.rss_mib:.2f}x the memory",
        flush=True,
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--sizes-mb",
        default="26,1024",
        help="synthetic trace sizes, comma-separated (default 26,1024: ~121k and ~4.8M events)",
    )
    ap.add_argument("--no-hta", action="store_true")
    ap.add_argument("--workers", help="chiptrace import --workers (default: its own choice)")
    ap.add_argument("--keep", metavar="DIR", help="make the synthetic traces in DIR and keep them")
    args = ap.parse_args()
    hta = not args.no_hta
    if hta:
        try:
            import hta as _  # noqa: F401
        except ImportError:
            print("HolisticTraceAnalysis not installed (pip install -e '.[hta]'): chiptrace only")
            hta = False
    extra = ["--workers", args.workers] if args.workers else []
    print(f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at the start")
    with tempfile.TemporaryDirectory(prefix="bench-import-") as tmp:
        work = Path(args.keep or tmp)
        work.mkdir(parents=True, exist_ok=True)
        for size in (int(x) for x in args.sizes_mb.split(",")):
            trace = work / f"synthetic-{size}MB.json"
            n = synthesize(trace, size) if not trace.exists() else _count(trace)
            print(f"synthetic Kineto trace: {trace.stat().st_size / 1e6:.0f} MB, {n:,} events")
            compare(f"synthetic-{size}MB", trace, n, hta, work, extra)


def _count(trace: Path) -> int:
    """Events in a kept synthetic trace (one per line, as synthesize writes them)."""
    with open(trace, "rb") as fh:
        return sum(1 for line in fh if line.startswith(b"{")) - 1


if __name__ == "__main__":
    main()
