"""Core throughput, chiptrace beside its peer in one run.

(The decorator's overhead, stalls and amortized CPU are in bench_hotpath.py.)

1. Buffers to Parquet: emulator-like spans written through the recorder's bulk path,
   spans/s and bytes per span on disk.
2. `chiptrace query` on 10,000,000 spans: GROUP BY chip type; per-chip busy time in
   100 ms windows.

Usage: python3 benchmarks/bench_core.py [--quick]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _results import Figure, machine, save  # noqa: E402
from _spans import synthetic_span_dir  # noqa: E402


def bench_parquet(n: int) -> list[Figure]:
    from chiptrace.config import resolve
    from chiptrace.recorder import Recorder, StoreSink
    from chiptrace.store import PartWriter

    tmp = Path(tempfile.mkdtemp(prefix="ct-bench-pq-"))
    batches = list(_emulator_like_batches(n, 100_000))
    cfg = resolve(dir=str(tmp), flush_spans=1_000_000, max_buffered=4_000_000, flush_interval_s=60)
    writer = PartWriter(tmp)
    rec = Recorder(cfg, [StoreSink(writer)], writer)
    t0 = time.perf_counter()
    for b in batches:
        rec.write_batch(b, block=True)
    rec.shutdown()
    dt = time.perf_counter() - t0
    size = sum(p.stat().st_size for p in (tmp / "spans").glob("*.parquet"))

    # peer: the same Arrow batches through pyarrow's plain writer (snappy, all defaults)
    import pyarrow as pa
    import pyarrow.parquet as pq

    t1 = time.perf_counter()
    pq.write_table(pa.Table.from_batches(batches), tmp / "peer.parquet")
    dt_peer = time.perf_counter() - t1
    size_peer = (tmp / "peer.parquet").stat().st_size
    shutil.rmtree(tmp, ignore_errors=True)
    print(f"== buffers to Parquet ({n:,} emulator-like spans)")
    print(
        f"  chiptrace recorder        {n / dt:12,.0f} spans/s  {size / n:6.1f} bytes/span (targets >= 1,000,000/s, <= 32 B)"
    )
    print(
        f"  pyarrow write_table deflt {n / dt_peer:12,.0f} spans/s  {size_peer / n:6.1f} bytes/span"
    )
    return [
        Figure(
            "recorder to Parquet, spans/s",
            "/s",
            n / dt,
            n / dt_peer,
            "pyarrow write_table",
            ">= 1000000",
            better="higher",
        ),
        Figure("bytes per span on disk", "B", size / n, size_peer / n, "pyarrow defaults", "<= 32"),
    ]


def _emulator_like_batches(n: int, chunk: int):
    from _spans import emulator_like_batch

    rng = np.random.default_rng(1)
    t = 1_700_000_000_000_000_000
    for start in range(0, n, chunk):
        b, t = emulator_like_batch(min(chunk, n - start), rng, t, start)
        yield b


def bench_query(n: int) -> list[Figure]:
    import duckdb

    import chiptrace

    d = synthetic_span_dir(n)
    con = chiptrace.connect(d)
    q1 = "SELECT chip_type, count(*), sum(end_ns - start_ns) FROM spans GROUP BY chip_type"
    q2 = """
        SELECT chip_id, (start_ns - t0) // 100000000 AS win, sum(end_ns - start_ns) AS busy_ns
        FROM spans_raw, (SELECT min(start_ns) AS t0 FROM spans_raw)
        WHERE chip_id IS NOT NULL GROUP BY ALL
    """
    figures = []
    targets = {"GROUP BY chip type": "<= 0.3", "per-chip busy, 100 ms windows": "<= 1"}
    for label, q in (("GROUP BY chip type", q1), ("per-chip busy, 100 ms windows", q2)):
        con.sql(q).fetchall()
        ts = []
        for _ in range(3):
            t0 = time.perf_counter()
            con.sql(q).fetchall()
            ts.append(time.perf_counter() - t0)
        files = [str(p) for p in (d / "spans").glob("*.parquet")]
        peer = duckdb.connect()
        peer.execute(f"CREATE VIEW spans AS SELECT * FROM read_parquet({files})")
        peer.execute("CREATE VIEW spans_raw AS SELECT * FROM spans")
        peer.sql(q).fetchall()
        t0 = time.perf_counter()
        peer.sql(q).fetchall()
        t_peer = time.perf_counter() - t0
        print(f"  {label:32s} chiptrace {min(ts):6.3f} s   raw DuckDB read_parquet {t_peer:6.3f} s")
        figures.append(
            Figure(
                f"query {label}, {n // 1_000_000}M spans",
                "s",
                min(ts),
                t_peer,
                "DuckDB read_parquet",
                targets[label],
            )
        )
    return figures


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    a = ap.parse_args()
    print(f"== core ({machine()})")
    figures = bench_parquet(500_000 if a.quick else 5_000_000)
    n = 1_000_000 if a.quick else 10_000_000
    print(f"== chiptrace query on {n:,} spans (targets: 0.3 s, 1 s)")
    figures += bench_query(n)
    for f in figures:
        print(f.line())
    print(f"  wrote {save('core', figures, 'quick' if a.quick else 'full')}")


if __name__ == "__main__":
    os.environ.setdefault("CHIPTRACE_SERVICE", "bench")
    main()
