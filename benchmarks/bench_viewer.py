"""Viewer benchmark: the live dashboard under 100,000 spans/s, and refresh cost vs stored spans.

    python3 benchmarks/bench_viewer.py [--quick]

1. Live: a thread feeds emulator-like span batches at a target rate into the in-process feed
   of a headless ViewerApp (App.run_test); we count dashboard refreshes per second and the
   process's CPU (time.process_time and psutil: cores used, 1.0 = one core).
2. Stored: refresh cost (snapshot + alerts, the work of one dashboard refresh besides
   drawing) with 1M and then 5M spans ingested, beside the peer: a naive refresh that
   re-queries all stored spans with DuckDB (per-chip busy time over the window and its
   history, and the window's slowest spans) over a trace dir holding the same counts.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import threading
import time
from pathlib import Path

import numpy as np
import psutil
import pyarrow as pa
import pyarrow.compute as pc

sys.path.insert(0, str(Path(__file__).parent))

from _spans import emulator_like_batch, synthetic_span_dir  # noqa: E402

from chiptrace.viewer.alerts import derive_alerts  # noqa: E402
from chiptrace.viewer.live_model import HISTORY_CELLS, LiveModel  # noqa: E402

WINDOW_NS = 100_000_000  # the dashboard's window: 100 ms


def _pool(n_batches: int, size: int) -> list[pa.RecordBatch]:
    rng = np.random.default_rng(11)
    t, out = 0, []
    for i in range(n_batches):
        b, t = emulator_like_batch(size, rng, 1_700_000_000_000_000_000 + t, i * size)
        out.append(b)
        t -= 1_700_000_000_000_000_000
    return out


def _retime(batch: pa.RecordBatch, shift: int) -> pa.RecordBatch:
    """The same spans moved `shift` ns later (cheaper than making new ones each time)."""
    cols = dict(zip(batch.schema.names, batch.columns, strict=True))
    for c in ("start_ns", "end_ns"):
        cols[c] = pc.add(cols[c], pa.scalar(shift, pa.int64()))
    return pa.RecordBatch.from_arrays(list(cols.values()), schema=batch.schema)


def _feeder(feed, rate: int, batch_size: int, stop: threading.Event, pool) -> None:  # noqa: ANN001
    """Write `rate` spans/s in batches, paced to wall time; spans are timed 'now'."""
    period = batch_size / rate
    t0 = time.monotonic()
    base = time.time_ns()
    k = 0
    span_of_pool = int(
        pool[-1].column("end_ns")[-1].as_py() - pool[0].column("start_ns")[0].as_py()
    )
    while not stop.is_set():
        b = pool[k % len(pool)]
        lap = k // len(pool)
        feed.write(_retime(b, base - 1_700_000_000_000_000_000 + lap * span_of_pool))
        k += 1
        wait = t0 + k * period - time.monotonic()
        if wait > 0:
            time.sleep(wait)


async def live(rate: int, seconds: float) -> dict[str, float]:
    from chiptrace.viewer.app import ViewerApp
    from chiptrace.viewer.sources import FeedSource, SpanFeed

    batch_size = 10_000
    pool = _pool(20, batch_size)
    feed = SpanFeed()
    app = ViewerApp([FeedSource(name="bench feed")], feed=feed, window_ns=WINDOW_NS)
    stop = threading.Event()
    proc = psutil.Process()
    async with app.run_test(size=(120, 40)) as pilot:
        th = threading.Thread(
            target=_feeder, args=(feed, rate, batch_size, stop, pool), daemon=True
        )
        th.start()
        await pilot.pause(1.0)  # warm up
        r0, s0, c0, w0 = app.refreshes, app.model.spans_total, time.process_time(), time.monotonic()
        proc.cpu_percent(None)
        await pilot.pause(seconds)
        r1, s1, c1, w1 = app.refreshes, app.model.spans_total, time.process_time(), time.monotonic()
        pct = proc.cpu_percent(None)
        stop.set()
        th.join()
    wall = w1 - w0
    return {
        "refresh_per_s": (r1 - r0) / wall,
        "spans_per_s": (s1 - s0) / wall,
        "cores": (c1 - c0) / wall,
        "psutil_cores": pct / 100,
        "dropped": feed.dropped,
        "refresh_ms": app.refresh_seconds / max(app.refreshes, 1) * 1e3,
    }


def _time(fn, repeats: int) -> float:  # noqa: ANN001
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def model_refresh_ms(model: LiveModel) -> float:
    def refresh() -> None:
        derive_alerts(model.snapshot(WINDOW_NS, HISTORY_CELLS))

    return _time(refresh, 30) * 1e3


NAIVE_SQL = """
WITH h AS (SELECT max(end_ns) AS head FROM spans_raw),
b AS (SELECT chip_id, (h.head - 1 - end_ns) // {w}::BIGINT AS cell,
             sum(least(end_ns, h.head) - greatest(start_ns, h.head - {w}::BIGINT * {cells})) AS busy
      FROM spans_raw, h WHERE chip_id IS NOT NULL AND end_ns > h.head - {w}::BIGINT * {cells}
      GROUP BY ALL)
SELECT chip_id, cell, busy FROM b
"""
NAIVE_SLOW = """
SELECT name, chip_id, end_ns - start_ns AS d FROM spans_raw
WHERE end_ns > (SELECT max(end_ns) FROM spans_raw) - {w}::BIGINT ORDER BY d DESC LIMIT 10
"""


def naive_refresh_ms(directory: Path) -> float:
    import chiptrace

    con = chiptrace.connect(directory)

    def refresh() -> None:
        con.sql(NAIVE_SQL.format(w=WINDOW_NS, cells=HISTORY_CELLS)).fetchall()
        con.sql(NAIVE_SLOW.format(w=WINDOW_NS)).fetchall()

    refresh()
    return _time(refresh, 5) * 1e3


def stored(sizes: tuple[int, int]) -> list[tuple[int, float, float]]:
    rng = np.random.default_rng(5)
    model = LiveModel()
    out = []
    t, seq = 1_700_000_000_000_000_000, 0
    for n in sizes:
        while model.spans_total < n:
            size = min(500_000, n - model.spans_total)
            b, t = emulator_like_batch(size, rng, t, seq)
            seq += size
            model.ingest(b)
        ours = model_refresh_ms(model)
        naive = naive_refresh_ms(synthetic_span_dir(n))
        out.append((n, ours, naive))
    return out


def _trace_table(n: int) -> pa.Table:
    """One trace of n spans over 8 GPUs and 4 links, as the explorer's query returns it."""
    rng = np.random.default_rng(3)
    lanes = np.arange(n) % 12
    start = np.sort(rng.integers(0, 2 * 10**9, n))
    chips = [f"gpu:{i}" if i < 8 else None for i in range(12)]
    links = [None] * 8 + [f"nvlink6:gpu:{i}-switch:0" for i in range(4)]
    return pa.table(
        {
            "span_id": [f"{i:016x}" for i in range(n)],
            "parent_span_id": [None] * n,
            "name": pa.array(["op"] * n).dictionary_encode(),
            "start_ns": start,
            "end_ns": start + rng.integers(1_000, 200_000, n),
            "chip_id": pa.array([chips[k] for k in lanes]),
            "link_id": pa.array([links[k] for k in lanes]),
        }
    )


async def waterfall(n: int) -> dict[str, float]:
    """Open an n-span trace in the waterfall and scroll it: layout once, then only the
    visible rows are drawn."""
    from textual.app import App

    from chiptrace.viewer.queries import critical_span_ids
    from chiptrace.viewer.widgets.waterfall import Waterfall, WaterfallRows

    table = _trace_table(n)
    t = time.perf_counter()
    crit, error = critical_span_ids(table)  # what the explorer runs (the analysis walk)
    assert error is None, error
    t_crit = time.perf_counter() - t
    t = time.perf_counter()
    rows = WaterfallRows(table, crit)
    t_layout = time.perf_counter() - t

    class One(App[None]):
        def compose(self):  # noqa: ANN202
            yield Waterfall()

    app = One()
    async with app.run_test(size=(120, 40)) as pilot:
        wf = app.query_one(Waterfall)
        wf.load(rows)
        wf.lanes = False  # a row per span: n rows, the worst case for drawing
        await pilot.pause()
        t = time.perf_counter()
        steps = 50
        for k in range(steps):  # jump through the whole trace, a screen drawn each time
            wf.scroll_to(0, (len(rows) - 40) * k // steps, animate=False)
            wf.refresh()
            await pilot.pause()
        t_scroll = (time.perf_counter() - t) / steps
    return {
        "layout_s": t_layout,
        "critical_s": t_crit,
        "screen_ms": t_scroll * 1e3,
        "rows": len(rows),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a small, fast run")
    args = ap.parse_args()
    rate, seconds = 100_000, (3.0 if args.quick else 10.0)
    sizes = (200_000, 1_000_000) if args.quick else (1_000_000, 5_000_000)

    print(
        f"chiptrace viewer benchmark ({'quick' if args.quick else 'full'}; "
        f"{psutil.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}; "
        f"window {WINDOW_NS / 1e6:.0f} ms, {HISTORY_CELLS} history cells)"
    )
    r = asyncio.run(live(rate, seconds))
    print(f"\nlive: fed {rate:,} spans/s for {seconds:.0f} s into a headless ViewerApp (120x40)")
    print(f"  ingested           {r['spans_per_s']:>10,.0f} spans/s   (dropped {r['dropped']:,})")
    print(f"  dashboard refresh  {r['refresh_per_s']:>10.1f} /s         (target >= 5)")
    print(
        f"  one refresh        {r['refresh_ms']:>10.2f} ms        (snapshot, alerts, widget updates)"
    )
    print(
        f"  CPU, process_time  {r['cores']:>10.2f} cores     (target <= 1; includes the feeder thread)"
    )
    print(f"  CPU, psutil        {r['psutil_cores']:>10.2f} cores")

    print("\nrefresh cost vs spans stored (median; chiptrace = snapshot + alerts of the window)")
    print(
        f"  {'stored':>10}  {'chiptrace ms':>12}  {'naive DuckDB ms':>15}  {'naive / chiptrace':>17}"
    )
    rows = stored(sizes)
    for n, ours, naive in rows:
        print(f"  {n:>10,}  {ours:>12.3f}  {naive:>15.1f}  {naive / ours:>16.0f}x")
    (n0, o0, v0), (n1, o1, v1) = rows
    print(f"  growth {n1 // n0}x stored: chiptrace {o1 / o0:.2f}x, naive {v1 / v0:.2f}x")
    print(
        f"  (load average now {os.getloadavg()[0]:.1f}: on a shared box the live figures vary with it)"
    )

    n = 100_000
    w = asyncio.run(waterfall(n))
    print(f"\nwaterfall of one {n:,}-span trace ({w['rows']:,} rows, a row per span, 120x40)")
    print(f"  layout (NumPy, once)        {w['layout_s'] * 1e3:8.1f} ms")
    print(f"  critical path (analysis)    {w['critical_s'] * 1e3:8.1f} ms   (in a worker thread)")
    print(f"  scroll + redraw one screen  {w['screen_ms']:8.2f} ms   (only visible rows are drawn)")


if __name__ == "__main__":
    main()
