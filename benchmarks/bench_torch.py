"""chiptrace.torch overhead, beside the plain loop and torch.profiler alone, in one run.

1. A real training loop (an MLP, SGD), each iteration a chiptrace `step` span, run three
   ways, interleaved and repeated (the median is kept): plain; under torch.profiler, then
   `export_chrome_trace` (what getting a trace out of torch.profiler costs); under
   `chiptrace.torch.profile()` (its export, plus the import into the store under the step
   spans). Once recording the whole loop, once with a schedule (a trace per cycle).
   Target: profile() adds no more than torch.profiler's own overhead plus 10%.
2. `device_time=True`: host time per span with it minus without it, on an empty block on
   `gpu:0` (CUDA only). Target: <= 5 us.

Usage: python3 benchmarks/bench_torch.py [--quick]    (needs PyTorch: pip install torch)
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable

try:
    import torch
except ImportError:  # `make bench` runs every benchmark; this one needs PyTorch
    print("bench_torch: PyTorch is not installed (pip install torch==2.13.0); skipped")
    sys.exit(0)

import chiptrace
import chiptrace.torch


def make_step() -> Callable[[], None]:
    torch.manual_seed(0)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    model = torch.nn.Sequential(
        torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10)
    ).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(64, 256, device=dev), torch.randint(0, 10, (64,), device=dev)

    def step() -> None:
        with chiptrace.span("step"):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()

    return step


def _loop(step: Callable[[], None], n: int, prof: object | None = None) -> None:
    for _ in range(n):
        step()
        if prof is not None:
            prof.step()  # type: ignore[attr-defined]
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def plain(step: Callable[[], None], n: int, schedule: object, tmp: str) -> None:
    _loop(step, n)


def torch_alone(step: Callable[[], None], n: int, schedule: object, tmp: str) -> None:
    count = iter(range(1 << 30))

    def export(p: torch.profiler.profile) -> None:
        path = os.path.join(tmp, f"torch-{next(count)}.json")
        p.export_chrome_trace(path)
        os.unlink(path)

    with torch.profiler.profile(
        activities=chiptrace.torch._profile.default_activities(),
        schedule=schedule,
        on_trace_ready=export,
    ) as prof:
        _loop(step, n, prof if schedule else None)


_imports: list[float] = []  # seconds from the block's end until its traces are stored


def chiptrace_profile(step: Callable[[], None], n: int, schedule: object, tmp: str) -> None:
    with chiptrace.torch.profile(schedule=schedule) as prof:
        _loop(step, n, prof if schedule else None)
    t0 = time.perf_counter()
    prof.wait()  # the import runs in a process of its own; not the program's time
    _imports.append(time.perf_counter() - t0)
    assert prof.traces_imported >= 1 and not prof.traces_failed


def bench_profile(n: int, repeats: int, schedule: object, label: str) -> None:
    step = make_step()
    tmp = tempfile.mkdtemp(prefix="ct-bench-torch-")
    chiptrace.init(os.path.join(tmp, "trace"), flush_interval_s=60)
    try:
        _loop(step, 20)  # warm: allocator, autograd, imports of the profiler and importer
        chiptrace_profile(step, 5, None, tmp)
        _imports.clear()
        waits: list[float] = []
        times: dict[str, list[float]] = {"plain": [], "torch": [], "chiptrace": []}
        cpu: dict[str, list[float]] = {"plain": [], "torch": [], "chiptrace": []}
        for _ in range(repeats):
            for name, fn in (
                ("plain", plain),
                ("torch", torch_alone),
                ("chiptrace", chiptrace_profile),
            ):
                t0, c0 = time.perf_counter(), time.process_time()
                fn(step, n, schedule, tmp)
                # Each way writes its step spans (profile() flushes the recorder to catch
                # them; the others would pay the same later): the same work in each.
                chiptrace.flush()
                took = time.perf_counter() - t0
                cpu[name].append(time.process_time() - c0)
                waited = _imports.pop() if name == "chiptrace" else 0.0
                times[name].append(took - waited)
                if name == "chiptrace":
                    waits.append(waited)
    finally:
        chiptrace.shutdown()
        shutil.rmtree(tmp, ignore_errors=True)
    _report(label, n, repeats, times, cpu, waits)


def _report(
    label: str,
    n: int,
    repeats: int,
    times: dict[str, list[float]],
    cpu: dict[str, list[float]],
    waits: list[float],
) -> None:
    base, peer, ours = (statistics.median(times[k]) for k in ("plain", "torch", "chiptrace"))
    cb, cp, co = (statistics.median(cpu[k]) for k in ("plain", "torch", "chiptrace"))
    over_peer, over_ours = peer - base, ours - base
    ratio = over_ours / over_peer if over_peer > 0 else float("inf")
    print(f"\n{label}: {n} training steps, median of {repeats}")
    print(f"  plain loop                  {base * 1e3:9.1f} ms")
    print(
        f"  torch.profiler + export     {peer * 1e3:9.1f} ms   overhead {over_peer * 1e3:8.1f} ms"
    )
    print(
        f"  chiptrace.torch.profile()   {ours * 1e3:9.1f} ms   overhead {over_ours * 1e3:8.1f} ms"
    )
    verdict = "ok" if ratio <= 1.10 else "OVER the target"
    print(f"  chiptrace/torch overhead    {ratio:9.2f}x   (target <= 1.10x: {verdict})")
    cratio = (co - cb) / (cp - cb) if cp > cb else float("inf")
    print(
        f"  CPU of the program: plain {cb * 1e3:.1f} ms, torch.profiler {cp * 1e3:.1f} ms, "
        f"chiptrace {co * 1e3:.1f} ms: overhead {cratio:.2f}x torch.profiler's"
    )
    print(
        f"  then in the import process  {statistics.median(waits) * 1e3:8.1f} ms until the "
        "traces are in the store (off the program's thread)"
    )


def bench_device_time(calls: int, repeats: int) -> None:
    print("\ndevice_time=True, host time per span (empty block on gpu:0)")
    if not torch.cuda.is_available():
        print("  not measurable here: no CUDA device (device_time is a no-op without one)")
        return
    tmp = tempfile.mkdtemp(prefix="ct-bench-dt-")
    chiptrace.init(tmp, flush_interval_s=0.5, max_buffered=10_000_000)
    torch.cuda.init()

    def run(device_time: bool) -> float:
        t0 = time.perf_counter_ns()
        for _ in range(calls):
            with chiptrace.span("k", chip="gpu:0", device_time=device_time):
                pass
        return (time.perf_counter_ns() - t0) / calls / 1000

    try:
        run(True), run(False)  # warm: the event pool, the timer
        on, off = [], []
        for _ in range(repeats):
            on.append(run(True))
            off.append(run(False))
            torch.cuda.synchronize()
    finally:
        chiptrace.shutdown()
        shutil.rmtree(tmp, ignore_errors=True)
    a, b = statistics.median(on), statistics.median(off)
    verdict = "ok" if a - b <= 5 else "OVER the target"
    print(f"  span, device_time=False     {b:7.2f} us")
    print(
        f"  span, device_time=True      {a:7.2f} us   (+{a - b:.2f} us; target <= 5 us: {verdict})"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer steps and repeats")
    args = ap.parse_args()
    n, repeats = (30, 3) if args.quick else (100, 7)
    # One intra-op thread: on a shared machine, a pool of them makes the loop's time swing
    # with the neighbours' load far more than any profiler does.
    torch.set_num_threads(1)
    print(f"torch {torch.__version__}, CUDA {'yes' if torch.cuda.is_available() else 'no'}")
    bench_profile(n, repeats, None, "whole loop recorded")
    schedule = torch.profiler.schedule(wait=1, warmup=1, active=n // 4, repeat=2)
    bench_profile(n, repeats, schedule, f"schedule wait=1 warmup=1 active={n // 4} repeat=2")
    bench_device_time(20_000 if not args.quick else 5_000, repeats)


if __name__ == "__main__":
    main()
