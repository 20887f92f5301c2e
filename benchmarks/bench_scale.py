"""`chiptrace import` and `report` on a Dask cluster of 1 and of 2 workers, side by side.

64 rank files made from the Kineto fixtures (benchmarks/rank_files.py: renumbered ranks,
shifted clocks, steps repeated to ~33 MB a file, >= 2 GB in all) are generated into a
temporary folder (deleted after), imported with `--dask local --workers N --partition-by
rank` and reported with `--dask local --workers N`, each as a fresh process (the
LocalCluster's start included, ~2 s). Printed: wall time of each, the speed-up of 2 workers
over 1 (targets: import >= 1.7x, report >= 1.5x on a 2-core machine), and the peak memory
of the largest worker process (target <= 2 GiB), beside the single-process import and
report of the same files (the peer: no Dask at all).

A speed-up needs two idle cores: run it on a quiet machine (the load average is printed).

    python benchmarks/bench_scale.py            # 64 files, ~2.1 GB: minutes
    python benchmarks/bench_scale.py --quick    # 8 small files: a smoke run

A full run saves its figures to benchmarks/results/scale.json (the README table).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from _results import Figure, save
from rank_files import make_rank_files

FULL = (64, 19)  # ranks, copies of the fixture's steps per rank: ~33 MB a file
QUICK = (8, 2)


def _processes() -> dict[int, tuple[int, int, float]]:
    """pid -> (parent pid, resident bytes, CPU seconds so far), from /proc."""
    out = {}
    page = os.sysconf("SC_PAGE_SIZE")
    tick = os.sysconf("SC_CLK_TCK")
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as fh:
                    fields = fh.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            cpu = (int(fields[11]) + int(fields[12])) / tick  # utime + stime
            out[int(entry)] = (int(fields[1]), int(fields[21]) * page, cpu)
    return out


def _descendants(root: int, procs: dict[int, tuple[int, int, float]]) -> set[int]:
    tree, todo = set(), [root]
    while todo:
        pid = todo.pop()
        tree.add(pid)
        todo += [c for c, (p, _, _) in procs.items() if p == pid and c not in tree]
    return tree


@dataclass
class Run:
    wall_s: float
    client_mib: float  # the chiptrace process itself
    worker_mib: float  # the largest other process of its tree (a Dask worker or nanny)
    # CPU seconds (as last sampled, every 0.1 s) of the chiptrace process (the client, with
    # a LocalCluster's scheduler in it) and of all the others (the workers): a wall-time
    # speed-up needs idle cores, these say where the work went on a loaded machine too.
    client_cpu_s: float = 0.0
    worker_cpu_s: float = 0.0


def measure(cmd: list[str]) -> Run:
    """Wall time and per-process peak RSS of a command and its process tree."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    peak: dict[int, int] = {}
    cpu: dict[int, float] = {}
    while proc.poll() is None:
        procs = _processes()
        for pid in _descendants(proc.pid, procs):
            rss, used = procs.get(pid, (0, 0, 0.0))[1:]
            peak[pid] = max(peak.get(pid, 0), rss)
            cpu[pid] = max(cpu.get(pid, 0.0), used)
        time.sleep(0.1)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"failed: {' '.join(cmd)}: {proc.stderr.read().decode()[-800:]}")
    others = [v for pid, v in peak.items() if pid != proc.pid]
    worker_cpu = sum(v for pid, v in cpu.items() if pid != proc.pid)
    return Run(
        wall,
        peak.get(proc.pid, 0) / 2**20,
        max(others, default=0) / 2**20,
        cpu.get(proc.pid, 0.0),
        worker_cpu,
    )


def chiptrace(*args: str) -> list[str]:
    return [sys.executable, "-m", "chiptrace", *args]


def line(label: str, r: Run) -> None:
    worker = f"  largest worker {r.worker_mib:6.0f} MiB" if r.worker_mib else ""
    cpu = f"  CPU-s client {r.client_cpu_s:6.1f} workers {r.worker_cpu_s:6.1f}"
    print(
        f"  {label:<28} {r.wall_s:7.2f} s  client {r.client_mib:6.0f} MiB{worker}{cpu}",
        flush=True,
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="8 small rank files: a smoke run")
    ap.add_argument("--keep", metavar="DIR", help="generate into DIR and keep the files")
    ap.add_argument("--ranks", type=int, help="rank files (default 64; --quick 8)")
    ap.add_argument("--copies", type=int, help="fixture steps repeated per file (19: ~33 MB)")
    args = ap.parse_args()
    ranks, copies = QUICK if args.quick else FULL
    ranks, copies = args.ranks or ranks, args.copies or copies
    partial = args.quick or (ranks, copies) != FULL  # only the full set's figures are saved
    print(f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at the start")
    with tempfile.TemporaryDirectory(prefix="bench-scale-", dir="/tmp") as tmp:
        work = Path(args.keep or tmp)
        inputs = work / "ranks"
        if not inputs.exists():
            make_rank_files(inputs, ranks, copies)
        size = sum(p.stat().st_size for p in inputs.iterdir())
        print(f"{ranks} rank files, {size / 1e9:.2f} GB of Kineto JSON in {inputs}")
        out = work / "store-1"
        shutil.rmtree(out, ignore_errors=True)
        line("import, no Dask (peer)", measure(chiptrace("import", str(inputs), "--out", str(out))))
        line("report, no Dask (peer)", measure(chiptrace("report", str(out), "--json")))
        runs: dict[int, tuple[Run, Run]] = {}
        for n in (1, 2):
            out = work / f"store-dask-{n}"
            shutil.rmtree(out, ignore_errors=True)
            dask = ["--dask", "local", "--workers", str(n)]
            imp = measure(
                chiptrace("import", str(inputs), "--out", str(out), "--partition-by", "rank", *dask)
            )
            rep = measure(chiptrace("report", str(out), "--json", *dask))
            line(f"import, {n} Dask worker(s)", imp)
            line(f"report, {n} Dask worker(s)", rep)
            runs[n] = (imp, rep)
            shutil.rmtree(out, ignore_errors=True)
        (i1, r1), (i2, r2) = runs[1], runs[2]
        worst = max(r.worker_mib for r in (i1, r1, i2, r2))
        print(
            f"speed-up of 2 workers over 1: import {i1.wall_s / i2.wall_s:.2f}x (target 1.7x), "
            f"report {r1.wall_s / r2.wall_s:.2f}x (target 1.5x); largest worker "
            f"{worst:.0f} MiB (target <= 2048)",
            flush=True,
        )
        print(f"load average {os.getloadavg()[0]:.1f} at the end")
        if not partial:
            save("scale", figures(i1, r1, i2, r2, ranks), "full")


def figures(i1: Run, r1: Run, i2: Run, r2: Run, ranks: int) -> list[Figure]:
    worst = max(r.worker_mib for r in (i1, r1, i2, r2))
    return [
        Figure(
            f"import {ranks} rank files, 2 Dask workers",
            "s",
            i2.wall_s,
            i1.wall_s,
            "1 worker",
            ">= 1.7",
            "ratio",
        ),
        Figure(
            f"report of {ranks} ranks, 2 Dask workers",
            "s",
            r2.wall_s,
            r1.wall_s,
            "1 worker",
            ">= 1.5",
            "ratio",
        ),
        Figure("largest Dask worker's peak memory", "MiB", worst, target="<= 2048"),
    ]


if __name__ == "__main__":
    main()
