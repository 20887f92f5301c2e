"""`chiptrace import` beside HolisticTraceAnalysis loading the same Kineto file.

Both run as fresh Python processes (start-up included); wall time and peak RSS (wait4's
ru_maxrss) of each, and the ratios. Files: the fixtures of 100k events or more, and a
synthetic Kineto trace of --size-mb (default 1024) made from the nccl_data fixture's events:
its steps repeated with shifted times, ids and correlations.

    python benchmarks/bench_import.py [--size-mb 1024] [--no-hta]

Needs `pip install -e '.[hta]'` for the HTA side.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

FIXTURES = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "kineto"
HTA = "from hta.trace_analysis import TraceAnalysis; TraceAnalysis(trace_dir={d!r})"


def synthesize(path: Path, size_mb: int) -> int:
    """A Kineto trace of about size_mb MB from nccl_data's events; returns its events."""
    doc = json.load(gzip.open(FIXTURES / "nccl_data.json.gz"))
    events = [e for e in doc.pop("traceEvents") if e.get("ph") in ("X", "s", "f")]
    t0 = min(e["ts"] for e in events)
    span = max(e["ts"] + e.get("dur", 0) for e in events) - t0 + 1000.0
    text = [json.dumps(e) for e in events]
    per_copy = sum(len(t) + 4 for t in text)
    copies = max(1, size_mb * 1_000_000 // per_copy)
    n = 0
    with open(path, "w") as fh:
        head = {k: v for k, v in doc.items() if k not in ("traceName", "baseTimeNanoseconds")}
        fh.write(json.dumps(head)[:-1] + ', "traceEvents": [\n')
        for c in range(copies):
            shift = c * span
            for e in events:
                e2 = dict(e, ts=round(e["ts"] + shift, 3))
                if e2.get("ph") == "X" and "ProfilerStep#" in e2["name"]:
                    e2["name"] = f"ProfilerStep#{c * 10 + int(e2['name'].split('#')[1])}"
                if "args" in e2 and "correlation" in e2["args"]:
                    e2["args"] = dict(
                        e2["args"], correlation=e2["args"]["correlation"] + c * 1_000_000
                    )
                if e2.get("ph") in ("s", "f"):
                    e2["id"] = e2["id"] + c * 1_000_000
                fh.write(("" if n == 0 else ",\n") + json.dumps(e2))
                n += 1
        fh.write(f'\n], "baseTimeNanoseconds": {doc.get("baseTimeNanoseconds", 0)}}}\n')
    return n


def measure(cmd: list[str]) -> tuple[float, float]:
    """(seconds, peak RSS in MiB) of a child process."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    dt = time.perf_counter() - t0
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"failed: {' '.join(cmd)}: {proc.stderr.read().decode()[-500:]}")
    return dt, usage.ru_maxrss / 1024


def compare(label: str, trace: Path, events: int, hta: bool, work: Path) -> None:
    out = work / f"out-{label}"
    shutil.rmtree(out, ignore_errors=True)
    exe = [sys.executable, "-m", "chiptrace", "import", str(trace), "--out", str(out)]
    ct, cm = measure(exe)
    line = f"{label:<28} {events:>10,} events  chiptrace import {ct:7.2f} s {cm:7.0f} MiB  {events / ct / 1e3:7.0f} k events/s"
    if hta:
        folder = work / f"hta-{label}"
        folder.mkdir(exist_ok=True)
        link = folder / trace.name
        if not link.exists():
            link.symlink_to(trace.resolve())
        ht, hm = measure([sys.executable, "-c", HTA.format(d=str(folder))])
        line += f"  |  HTA TraceAnalysis {ht:7.2f} s {hm:7.0f} MiB  |  {ht / ct:5.1f}x faster, {cm / hm:5.2f}x memory"
    print(line, flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size-mb", type=int, default=1024)
    ap.add_argument("--no-hta", action="store_true")
    ap.add_argument("--min-events", type=int, default=100_000)
    args = ap.parse_args()
    hta = not args.no_hta
    if hta:
        try:
            import hta as _  # noqa: F401
        except ImportError:
            print("HolisticTraceAnalysis not installed (pip install -e '.[hta]'): chiptrace only")
            hta = False
    with tempfile.TemporaryDirectory(prefix="bench-import-") as tmp:
        work = Path(tmp)
        for f in sorted(FIXTURES.glob("*.json.gz")):
            n = len(json.load(gzip.open(f)).get("traceEvents", []))
            if n >= args.min_events:
                compare(f.name, f, n, hta, work)
        big = work / "synthetic.json"
        n = synthesize(big, args.size_mb)
        print(f"synthetic Kineto trace: {big.stat().st_size / 1e6:.0f} MB, {n:,} events")
        compare(f"synthetic-{args.size_mb}MB", big, n, hta, work)


if __name__ == "__main__":
    main()
