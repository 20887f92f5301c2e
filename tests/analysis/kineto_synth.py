"""Synthetic multi-rank PyTorch profiler (Kineto) traces, one JSON document per rank, for
tests of what the report says about ranks: each rank's steps launch compute kernels one
by one from the host, then an NCCL all-reduce that ends on every rank when the last rank
has arrived (so an early rank's collective kernel is long: it waits).

Times are whole microseconds. Everything a test varies is a per-rank list.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

T0_US = 1_700_000_000_000_000
STEP_US = 60_000
OPS = 20
COMM_US = 2_000
NCCL = "ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)"


@dataclass
class Job:
    """A job of `ranks` ranks and `steps` steps; each list holds one value per rank."""

    ranks: int = 8
    steps: int = 6
    skew_us: list[int] = field(default_factory=list)  # when the rank's steps start
    host_op_us: list[int] = field(default_factory=list)  # each CPU op that launches a kernel
    gap_us: list[int] = field(default_factory=list)  # host time between two ops
    kernel_us: list[int] = field(default_factory=list)  # each compute kernel
    loader_us: int = 0  # a DataLoader fetch at each step's start (the GPU waits for it)
    first_malloc_us: int = 0  # one cudaMalloc at the first step's start (a warm-up)

    def __post_init__(self) -> None:
        n = self.ranks
        self.skew_us = self.skew_us or [r * 300 for r in range(n)]
        self.host_op_us = self.host_op_us or [50] * n
        self.gap_us = self.gap_us or [100] * n
        self.kernel_us = self.kernel_us or [100] * n


def _x(cat: str, name: str, pid: int, tid: int, ts: int, dur: int, **args: Any) -> dict:
    return {
        "ph": "X",
        "cat": cat,
        "name": name,
        "pid": pid,
        "tid": tid,
        "ts": ts,
        "dur": dur,
        "args": args,
    }


def _launch(
    ev: list, r: int, corr: int, at: int, gpu_free: int, name: str, dur: int, stream: int
) -> tuple[int, int]:
    """A runtime launch at `at` on rank r's host thread and its kernel; (start, end) of it."""
    host = 1000 + r
    ev.append(_x("cuda_runtime", "cudaLaunchKernel", host, host, at, 5, correlation=corr))
    start = max(at + 10, gpu_free)
    ev.append(_x("kernel", name, r, stream, start, dur, device=r, stream=stream, correlation=corr))
    return start, start + dur


def documents(job: Job) -> list[dict]:
    """One Kineto document per rank."""
    events: list[list[dict]] = [[] for _ in range(job.ranks)]
    corr = 1
    for k in range(job.steps):
        arrive: list[int] = []
        gpu_free = [0] * job.ranks
        host_end = [0] * job.ranks
        nccl_corr = [0] * job.ranks
        for r in range(job.ranks):
            ev, host = events[r], 1000 + r
            t = T0_US + k * STEP_US + job.skew_us[r]
            step_start = t
            t += 10
            if k == 0 and job.first_malloc_us:
                ev.append(_x("cuda_runtime", "cudaMalloc", host, host, t, job.first_malloc_us))
                t += job.first_malloc_us + 10
            if job.loader_us:
                name = "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"
                ev.append(_x("user_annotation", name, host, host, t, job.loader_us))
                t += job.loader_us + 10
            for i in range(OPS):
                op = job.host_op_us[r]
                ev.append(_x("cpu_op", "aten::mm", host, host, t, op))
                _, gpu_free[r] = _launch(
                    ev, r, corr, t + 1, gpu_free[r], f"gemm_kernel_{i % 3}", job.kernel_us[r], 7
                )
                corr += 1
                t += op + job.gap_us[r]
            ev.append(_x("cpu_op", "nccl:all_reduce", host, host, t, 20))
            ev.append(
                _x("cuda_runtime", "cudaLaunchKernel", host, host, t + 1, 5, correlation=corr)
            )
            arrive.append(max(t + 10, gpu_free[r]))
            host_end[r] = t + 30
            nccl_corr[r] = corr
            corr += 1
            ev.append(
                _x(
                    "user_annotation",
                    f"ProfilerStep#{k + 1}",
                    host,
                    host,
                    step_start,
                    host_end[r] - step_start,
                )
            )
        end = max(arrive) + COMM_US
        for r in range(job.ranks):
            c = nccl_corr[r]
            events[r].append(
                _x(
                    "kernel",
                    NCCL,
                    r,
                    20,
                    arrive[r],
                    end - arrive[r],
                    device=r,
                    stream=20,
                    correlation=c,
                )
            )
    return [
        {
            "schemaVersion": 1,
            "distributedInfo": {"backend": "nccl", "rank": r, "world_size": job.ranks},
            "traceEvents": events[r],
        }
        for r in range(job.ranks)
    ]


def write(job: Job, folder: Path) -> list[Path]:
    """The job's documents as rank-N.json files in `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    out = []
    for r, doc in enumerate(documents(job)):
        p = folder / f"rank-{r}.json"
        p.write_text(json.dumps(doc))
        out.append(p)
    return out
