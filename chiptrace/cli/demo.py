"""`chiptrace demo`: the main job. Runs a workload and shows where its time went."""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures as cf
import time
from pathlib import Path

NAME = "demo"
ORDER = 0
HELP = "run a sample workload on the emulated rack and show where the time went"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", metavar="DIR", help="trace dir (default: ./chiptrace-traces/demo-<time>)")
    p.add_argument("--steps", type=int, default=20, help="training steps to run")


def _decorated_pipeline(steps: int) -> None:
    """A small data-parallel step written with decorators: load on the CPU, copy over
    PCIe, compute on two GPUs in threads, all-reduce over NVLink, asyncio for I/O."""
    import chiptrace

    @chiptrace.trace(chip="cpu:0", op="io")
    def load_batch(i: int) -> list[int]:
        time.sleep(0.002)
        return list(range(1000))

    @chiptrace.trace(link="pcie5:cpu:0-gpu:0", attributes={"op.bytes": 4_000_000})
    def copy_to_gpu(batch: list[int]) -> list[int]:
        time.sleep(0.001)
        return batch

    @chiptrace.trace(op="compute", precision="bf16")
    def forward_backward(gpu: str, batch: list[int]) -> int:
        with chiptrace.span("matmul", chip=gpu, precision="bf16") as s:
            s.set_attribute("op.flops", 2 * 4096**3)
            time.sleep(0.004 if gpu == "gpu:1" else 0.003)
        return sum(batch)

    @chiptrace.trace(link="nvlink6:gpu:0-gpu:1", attributes={"op.bytes": 64_000_000})
    def allreduce() -> None:
        time.sleep(0.001)

    @chiptrace.trace(chip="cpu:0", op="io")
    async def checkpoint(step: int) -> None:
        await asyncio.sleep(0.001)

    @chiptrace.trace(name="train_step")
    def step(pool: cf.ThreadPoolExecutor, i: int) -> None:
        batch = copy_to_gpu(load_batch(i))
        futures = [pool.submit(chiptrace.carry(forward_backward), g, batch) for g in ("gpu:0", "gpu:1")]
        for f in futures:
            f.result()
        allreduce()
        asyncio.run(checkpoint(i))

    with cf.ThreadPoolExecutor(2) as pool:
        for i in range(steps):
            step(pool, i)


def run(args: argparse.Namespace) -> int:
    import chiptrace
    from chiptrace.cli.query import format_table
    from chiptrace.query import connect

    out = Path(args.out or f"chiptrace-traces/demo-{time.strftime('%Y%m%d-%H%M%S')}")
    chiptrace.init(out, service="chiptrace-demo")
    _decorated_pipeline(args.steps)
    chiptrace.shutdown()
    con = connect(out)
    table = con.sql(
        "SELECT coalesce(chip_type, link_type, '-') AS on_, name, count(*) AS calls, "
        "round(sum(duration_ns) / 1e6, 2) AS total_ms, round(avg(duration_ns) / 1e3, 1) AS mean_us "
        "FROM spans GROUP BY ALL ORDER BY total_ms DESC"
    ).to_arrow_table()
    print(f"chiptrace demo: {args.steps} steps traced into {out}\n")
    print(format_table(table))
    print(f'next: chiptrace query {out} "SELECT * FROM chips"')
    return 0
