"""What host sampling costs: chiptrace's sampler at 10 Hz vs a plain psutil loop.

Both run for the same wall time on an otherwise idle process and read the same counters
(per-CPU times, memory, per-NIC and per-disk I/O); chiptrace also turns them into rows,
writes Parquet parts and keeps a manifest. Cost is the CPU time of the sampling thread
(time.thread_time inside it), and, as a cross-check, the whole process's CPU time over
the interval against the same interval with no sampler. Budget: 2% of one core.

    python3 benchmarks/bench_host.py [--quick] [--seconds S] [--hz HZ]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import threading
import time

import psutil

from chiptrace.host import HostSampler

BUDGET = 0.02  # of one core


def _process_cpu() -> float:
    t = os.times()
    return t.user + t.system


def psutil_loop(seconds: float, hz: float) -> tuple[float, int]:
    """The peer: a thread reading the same counters at `hz`, keeping only the last."""
    stop = threading.Event()
    result: dict[str, float] = {}

    def run() -> None:
        interval, ticks = 1.0 / hz, 0
        psutil.cpu_times(percpu=True)  # warm psutil's caches like the sampler's probes do
        start = time.thread_time()
        next_tick = time.monotonic() + interval
        while not stop.wait(max(0.0, next_tick - time.monotonic())):
            psutil.cpu_times(percpu=True)
            psutil.virtual_memory()
            psutil.net_io_counters(pernic=True)
            psutil.disk_io_counters(perdisk=True)
            ticks += 1
            next_tick += interval
        result["cpu"], result["ticks"] = time.thread_time() - start, ticks

    t = threading.Thread(target=run, daemon=True)
    t.start()
    time.sleep(seconds)
    stop.set()
    t.join()
    return result["cpu"], int(result["ticks"])


def chiptrace_sampler(seconds: float, hz: float) -> tuple[float, int, int, str]:
    """chiptrace's sampler for `seconds`: thread CPU after start-up, ticks, rows, NVML."""
    with tempfile.TemporaryDirectory() as d:
        s = HostSampler(d, interval=1.0 / hz).start()
        s.wait_ready()
        time.sleep(2.0 / hz)  # past the first tick: start-up (imports, NVML) is not per-tick cost
        cpu0, ticks0 = s.thread_cpu_s, s.ticks
        time.sleep(seconds)
        s.stop()  # includes the last Parquet part and manifest
        return s.thread_cpu_s - cpu0, s.ticks - ticks0, s.rows_written, s.nvml_status


def process_delta(seconds: float, hz: float | None) -> float:
    """Process CPU seconds over `seconds` of idling, with the sampler on (hz) or off."""
    with tempfile.TemporaryDirectory() as d:
        s = HostSampler(d, interval=1.0 / hz).start() if hz else None
        if s is not None:
            s.wait_ready()
            time.sleep(0.3)
        c0 = _process_cpu()
        time.sleep(seconds)
        c1 = _process_cpu()
        if s is not None:
            s.stop()
        return c1 - c0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="3 s per measurement instead of 10")
    ap.add_argument("--seconds", type=float, default=None)
    ap.add_argument("--hz", type=float, default=10.0)
    args = ap.parse_args()
    secs = args.seconds or (3.0 if args.quick else 10.0)
    hz = args.hz

    peer_cpu, peer_ticks = psutil_loop(secs, hz)
    ct_cpu, ct_ticks, rows, nvml = chiptrace_sampler(secs, hz)
    off = process_delta(secs, None)
    on = process_delta(secs, hz)

    def pct(cpu: float) -> str:
        return f"{100 * cpu / secs:6.3f}% of a core"

    print(f"host sampling at {hz:g} Hz for {secs:g} s ({psutil.cpu_count()} CPUs; {nvml})")
    print(f"{'':32}{'CPU s':>9}  {'cost':>18}  {'per tick':>10}  ticks")
    print(
        f"{'psutil loop (peer, no storage)':32}{peer_cpu:9.4f}  {pct(peer_cpu)}  "
        f"{1e6 * peer_cpu / max(peer_ticks, 1):8.0f}us  {peer_ticks}"
    )
    print(
        f"{'chiptrace HostSampler':32}{ct_cpu:9.4f}  {pct(ct_cpu)}  "
        f"{1e6 * ct_cpu / max(ct_ticks, 1):8.0f}us  {ct_ticks}  ({rows} rows to Parquet)"
    )
    print(f"ratio chiptrace / peer: {ct_cpu / peer_cpu if peer_cpu else float('inf'):.2f}x")
    print(
        f"process CPU over {secs:g} s idle: sampler off {off:.4f} s, on {on:.4f} s "
        f"-> {pct(max(0.0, on - off)).strip()} attributable"
    )
    verdict = "within" if ct_cpu / secs <= BUDGET else "OVER"
    print(f"budget {100 * BUDGET:g}% of one core: chiptrace {verdict} ({100 * ct_cpu / secs:.3f}%)")


if __name__ == "__main__":
    main()
