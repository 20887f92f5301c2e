"""`chiptrace collect` ingest rate, beside a bare opentelemetry-proto receiver.

Two client processes replay pre-encoded OTLP/HTTP protobuf requests of 512 spans each
(encoded once by the OpenTelemetry SDK's own encoder from real SDK spans: a server span and
ops with chip, op and generic attributes) over keep-alive connections, as fast as the
receiver acknowledges them:

- chiptrace: `chiptrace collect --out DIR` (decode to columns, buffer, Parquet parts); after
  the run it is sent SIGTERM and every span is counted back from the Parquet files.
- peer: a bare receiver (http.server + opentelemetry-proto `ExportTraceServiceRequest`
  parse, spans counted, nothing stored): the floor any Python OTLP receiver pays.

Usage: python3 benchmarks/bench_collect.py [--quick]
"""

from __future__ import annotations

import argparse
import http.client
import json
import multiprocessing as mp
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.parse
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PEER = ROOT / "tests" / "exporters" / "otlp_receiver.py"
SPANS_PER_REQUEST = 512
DISTINCT_REQUESTS = 16


def make_requests() -> list[bytes]:
    """Serialized requests from real SDK spans (distinct ids in each)."""
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from opentelemetry.trace import SpanKind

    memory = InMemorySpanExporter()
    tp = TracerProvider(
        resource=Resource({"service.name": "trainer", "host.name": "node1", "process.pid": 7})
    )
    tp.add_span_processor(SimpleSpanProcessor(memory))
    tracer = tp.get_tracer("train.loop", "1.0")
    bodies = []
    for r in range(DISTINCT_REQUESTS):
        memory.clear()
        with tracer.start_as_current_span(f"step {r}", kind=SpanKind.SERVER):
            for i in range(SPANS_PER_REQUEST - 1):
                attrs = {
                    "chip.id": f"gpu:{i % 8}",
                    "chip.type": "gpu",
                    "op.kind": "compute",
                    "op.flops": (i % 64) << 30,
                    "layer": i % 32,
                    "phase": "fwd" if i % 2 else "bwd",
                }
                with tracer.start_as_current_span(f"layer.{i % 32}", attributes=attrs):
                    pass
        bodies.append(encode_spans(memory.get_finished_spans()).SerializeToString())
    tp.shutdown()
    return bodies


def client(url: str, bodies: list[bytes], requests: int, start: mp.Event, out: mp.Queue) -> None:
    parsed = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=60)
    headers = {"Content-Type": "application/x-protobuf"}
    start.wait()
    ok = 0
    for i in range(requests):
        conn.request("POST", parsed.path, bodies[i % len(bodies)], headers)
        resp = conn.getresponse()
        resp.read()
        if resp.status == 200:
            ok += 1
    conn.close()
    out.put(ok)


def drive(url: str, bodies: list[bytes], requests: int, clients: int = 2) -> tuple[float, int]:
    """Run the clients; returns (seconds, acknowledged requests)."""
    ctx = mp.get_context("fork")
    start, out = ctx.Event(), ctx.Queue()
    procs = [
        ctx.Process(target=client, args=(url, bodies, requests, start, out)) for _ in range(clients)
    ]
    for p in procs:
        p.start()
    time.sleep(0.3)
    t0 = time.perf_counter()
    start.set()
    acked = sum(out.get(timeout=600) for _ in procs)
    secs = time.perf_counter() - t0
    for p in procs:
        p.join()
    return secs, acked


def run_chiptrace(
    bodies: list[bytes], requests: int, clients: int, source: str | None = None
) -> tuple[float, int, float]:
    import chiptrace

    out = Path(tempfile.mkdtemp(prefix="chiptrace-collect-bench-")) / "trace"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "chiptrace",
            "collect",
            "--listen",
            "127.0.0.1:0",
            "--out",
            str(out),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        # Another checkout's chiptrace (the code before a change) runs first on the path.
        env={**os.environ, "PYTHONPATH": source} if source else None,
    )
    url = proc.stdout.readline().split()[3]
    secs, acked = drive(url, bodies, requests, clients)
    t0 = time.perf_counter()
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=120)
    flush_s = time.perf_counter() - t0
    stored = chiptrace.connect(out).sql("SELECT count(*) FROM spans_raw").fetchall()[0][0]
    assert stored == acked * SPANS_PER_REQUEST, (
        f"stored {stored}, acknowledged {acked * SPANS_PER_REQUEST}"
    )
    return secs, stored, flush_s


def run_peer(bodies: list[bytes], requests: int, clients: int) -> tuple[float, int]:
    proc = subprocess.Popen(
        [sys.executable, str(PEER)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    port = json.loads(proc.stdout.readline())["http"]
    url = f"http://127.0.0.1:{port}/v1/traces"
    secs, acked = drive(url, bodies, requests, clients)
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("GET", "/stats")
    counted = json.loads(conn.getresponse().read())["spans"]
    proc.stdin.close()
    proc.wait(timeout=30)
    assert counted == acked * SPANS_PER_REQUEST
    return secs, counted


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small run (20 requests a client)")
    ap.add_argument("--clients", type=int, default=4, help="sender processes (default 4)")
    ap.add_argument(
        "--baseline",
        metavar="SRC",
        help="also run the chiptrace package found in SRC (e.g. an older checkout) as a row",
    )
    args = ap.parse_args()
    requests = 20 if args.quick else 200
    bodies = make_requests()
    c_secs, c_spans, flush_s = run_chiptrace(bodies, requests, args.clients)
    rows = [("chiptrace collect (WAL, decode, buffer, Parquet; all counted back)", c_spans, c_secs)]
    if args.baseline:
        b_secs, b_spans, _ = run_chiptrace(bodies, requests, args.clients, args.baseline)
        rows.append((f"chiptrace collect from {args.baseline}", b_spans, b_secs))
    p_secs, p_spans = run_peer(bodies, requests, args.clients)
    rows.append(("bare opentelemetry-proto receiver (parse + count, no storage)", p_spans, p_secs))
    c_rate, p_rate = c_spans / c_secs, p_spans / p_secs
    print(
        f"OTLP/HTTP ingest, {args.clients} clients replaying {SPANS_PER_REQUEST}-span requests "
        f"({len(bodies[0]) / SPANS_PER_REQUEST:.0f} bytes/span)"
    )
    print(f"{'receiver':<70}{'spans':>10}{'spans/s':>12}")
    for name, spans, secs in rows:
        print(f"{name:<70}{spans:>10,}{spans / secs:>12,.0f}")
    if args.baseline:
        print(f"ratio chiptrace/baseline: {c_rate / (rows[1][1] / rows[1][2]):.2f}x")
    print(
        f"ratio chiptrace/bare: {c_rate / p_rate:.2f}x; target >= 150,000 spans/s acknowledged: "
        f"{'met' if c_rate >= 150_000 else 'NOT met'}"
    )
    print(
        f"chiptrace end to end, including the final flush to Parquet after SIGTERM ({flush_s:.2f}s): "
        f"{c_spans / (c_secs + flush_s):,.0f} spans/s"
    )


if __name__ == "__main__":
    main()
