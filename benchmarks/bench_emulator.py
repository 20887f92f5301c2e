"""Emulator throughput: nvl72 training emulated and written as Parquet, against the OTel SDK.

chiptrace: `emulate(topology="nvl72", workload="train")` end to end (model, span columns,
Parquet parts, manifest), in a child process so its peak RSS is its own; run at two lengths
to show memory does not grow with the run.
peer: the same number of spans made with the OpenTelemetry SDK the usual way
(`tracer.start_span(...)` / `span.end()`, chip attributes, a BatchSpanProcessor and an
exporter that discards), i.e. the cost of producing them as span objects at all.

    python3 benchmarks/bench_emulator.py           # full (about 2 minutes)
    python3 benchmarks/bench_emulator.py --quick   # small run
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def child(steps: int, quick: bool, out: str) -> None:
    from chiptrace.emulator import emulate

    options = {"layers": "4"} if quick else None
    t0 = time.perf_counter()
    r = emulate(
        topology="nvl72",
        workload="train",
        steps=steps,
        seed=1,
        out=out,
        options=options,
        progress=False,
    )
    wall = time.perf_counter() - t0
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    size = sum(p.stat().st_size for p in Path(out).rglob("*.parquet"))
    print(json.dumps({"spans": r.spans, "wall_s": wall, "rss_mb": rss, "bytes": size}))


def run_child(steps: int, quick: bool) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, __file__, "--child", str(steps), "--out", tmp] + (
            ["--quick"] if quick else []
        )
        done = subprocess.run(cmd, capture_output=True, text=True, check=True)
        return json.loads(done.stdout.strip().splitlines()[-1])


def otel_peer(n: int) -> tuple[float, int]:
    """Seconds to make n spans with the OTel SDK (BatchSpanProcessor, discarding exporter)."""
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

    class Discard(SpanExporter):
        exported = 0

        def export(self, spans):  # noqa: ANN001, ANN201
            Discard.exported += len(spans)
            return SpanExportResult.SUCCESS

    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(Discard()))
    tracer = provider.get_tracer("bench")
    t0 = time.perf_counter()
    start = time.time_ns()
    root = tracer.start_span("train_step", start_time=start)
    ctx = trace.set_span_in_context(root)
    for i in range(n - 1):
        s = tracer.start_span(
            "allreduce.ring",
            context=ctx,
            start_time=start + i,
            attributes={
                "link.id": "nvlink5:gpu:0-switch:0",
                "link.type": "nvlink5",
                "link.src": "gpu:0",
                "link.dst": "switch:0",
                "op.kind": "comm",
                "op.bytes": 1 << 20,
            },
        )
        s.end(end_time=start + i + 1000)
    root.end()
    provider.shutdown()
    return time.perf_counter() - t0, Discard.exported


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--child", type=int)
    ap.add_argument("--out")
    args = ap.parse_args()
    if args.child:
        child(args.child, args.quick, args.out)
        return
    lengths = (1, 2) if args.quick else (1, 4)
    runs = [run_child(s, args.quick) for s in lengths]
    head, big = runs[0], runs[-1]
    rate = big["spans"] / big["wall_s"]
    print(
        f"chiptrace emulate nvl72 train, {lengths[-1]} steps: {big['spans']:,} spans in {big['wall_s']:.2f} s = "
        f"{rate:,.0f} spans/s end to end ({big['bytes'] / big['spans']:.1f} bytes/span on disk)"
    )
    for s, r in zip(lengths, runs, strict=True):
        print(
            f"  {s} step(s): {r['spans']:,} spans, {r['spans'] / r['wall_s']:,.0f} spans/s "
            f"(setup included), peak RSS {r['rss_mb']:.0f} MB"
        )
    peer_s, exported = otel_peer(head["spans"])
    peer_rate = head["spans"] / peer_s
    print(
        f"OpenTelemetry SDK start_span/end + BatchSpanProcessor (discarding exporter): {head['spans']:,} spans "
        f"(one step's worth) in {peer_s:.2f} s = {peer_rate:,.0f} spans/s ({exported:,} reached the exporter, "
        "the rest were dropped by its queue)"
    )
    print(
        f"ratio: chiptrace emulator / OTel SDK = {rate / peer_rate:.1f}x  (target >= 300,000 spans/s: "
        f"{'met' if rate >= 300_000 else 'NOT met'})"
    )


if __name__ == "__main__":
    main()
