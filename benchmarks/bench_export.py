"""OTLP export throughput: chiptrace's columnar encoder beside the OpenTelemetry SDK path.

Both send the same stored spans to the same loopback OTLP receiver (a separate process
that parses every request with opentelemetry-proto and counts the spans):

- chiptrace: `export_dirs(DIR, URL)`: DuckDB reads the Parquet parts, the encoder writes
  OTLP protobuf straight from the Arrow columns, HTTP/protobuf (and gRPC) sends it.
- SDK: the same table -> `chiptrace.recording.otel_sinks.batch_to_readable_spans` -> the SDK's
  `OTLPSpanExporter` (HTTP/protobuf, its own encoder), in requests of the same size.

It also times the encoders alone (bytes built, nothing sent) on the same spans.

File exports (`--files`): an emulated run (`emulate --topology nvl72 --steps N`: 1.84M
spans a step) written as Chrome JSON beside Jaeger JSON (the peer: the same store, the
same SpanSource, the same machine), each `chiptrace export` in its own process: seconds,
spans/s, files, bytes, and the process's peak RSS (target <= 1 GiB for any run).

Usage: python3 benchmarks/bench_export.py [--quick] [--files [--steps N]]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _spans import synthetic_span_dir  # noqa: E402

RECEIVER = ROOT / "tests" / "exporters" / "otlp_receiver.py"
BATCH = 2048


class Receiver:
    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(RECEIVER)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        ports = json.loads(self.proc.stdout.readline())
        self.http = f"http://127.0.0.1:{ports['http']}"
        self.grpc = f"grpc://127.0.0.1:{ports['grpc']}"

    def spans(self) -> int:
        with urllib.request.urlopen(self.http + "/stats", timeout=30) as r:
            return json.loads(r.read())["spans"]

    def stop(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


def bench_chiptrace(trace_dir: Path, url: str, recv: Receiver) -> tuple[float, int]:
    from chiptrace.exporters.otlp import export_dirs

    before = recv.spans()
    t0 = time.perf_counter()
    result = export_dirs(trace_dir, url, batch_spans=BATCH)
    secs = time.perf_counter() - t0
    got = recv.spans() - before
    assert got == result.spans, f"receiver counted {got}, exporter sent {result.spans}"
    return result.spans / secs, got


def bench_sdk(table, url: str, recv: Receiver) -> tuple[float, int]:
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    from chiptrace.recording.otel_sinks import batch_to_readable_spans

    exporter = OTLPSpanExporter(endpoint=url + "/v1/traces")
    before = recv.spans()
    t0 = time.perf_counter()
    for batch in table.to_batches(max_chunksize=BATCH):
        result = exporter.export(list(batch_to_readable_spans(batch)))
        assert result.name == "SUCCESS", result
    secs = time.perf_counter() - t0
    exporter.shutdown()
    got = recv.spans() - before
    assert got == table.num_rows, f"receiver counted {got}, expected {table.num_rows}"
    return table.num_rows / secs, got


def bench_encoders(table) -> tuple[float, float]:
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans as sdk_encode

    from chiptrace.exporters.otlp_encode import encode_spans, requests
    from chiptrace.recording.otel_sinks import batch_to_readable_spans

    t0 = time.perf_counter()
    for batch in table.to_batches(max_chunksize=65536):
        for _ in requests(encode_spans(batch), BATCH):
            pass
    ours = table.num_rows / (time.perf_counter() - t0)
    t0 = time.perf_counter()
    for batch in table.to_batches(max_chunksize=BATCH):
        sdk_encode(list(batch_to_readable_spans(batch))).SerializeToString()
    sdk = table.num_rows / (time.perf_counter() - t0)
    return ours, sdk


def _measured(argv: list[str]) -> tuple[float, float]:
    """Run `chiptrace ARGV` in its own process: (seconds, peak RSS in MiB)."""
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "chiptrace", *argv], stdout=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    assert proc.returncode == 0, f"chiptrace {' '.join(argv)} exited {proc.returncode}"
    return time.perf_counter() - t0, usage.ru_maxrss / 1024  # KiB on Linux


def bench_files(steps: int, quick: bool) -> None:
    """Chrome JSON beside Jaeger JSON from one emulated run: time, size, peak RSS."""
    work = Path(tempfile.mkdtemp(prefix="chiptrace-bench-export-"))
    try:
        run = work / "run"
        topo = ["--topology", "rack6"] if quick else ["--topology", "nvl72"]
        secs, rss = _measured(["emulate", *topo, "--steps", str(steps), "--out", str(run)])
        import chiptrace

        spans = chiptrace.connect(run).sql("SELECT count(*) FROM spans_raw").fetchall()[0][0]
        print(
            f"\nFile exports of one emulated run ({' '.join(topo[1:])}, {steps} steps, "
            f"{spans:,} spans; emulate {secs:.1f} s, peak RSS {rss:.0f} MiB)"
        )
        print(f"{'format':<34}{'s':>8}{'spans/s':>11}{'files':>7}{'MB':>9}{'peak RSS MiB':>14}")
        for fmt in ("chrome", "jaeger-json"):
            out = work / fmt / "trace.json"
            out.parent.mkdir()
            secs, rss = _measured(["export", str(run), "-f", fmt, "-o", str(out)])
            files = sorted(out.parent.glob("*.json"))
            mb = sum(f.stat().st_size for f in files) / 1e6
            name = f"{fmt} (default --split-mb)"
            print(
                f"{name:<34}{secs:>8.1f}{spans / secs:>11,.0f}{len(files):>7}{mb:>9.0f}"
                f"{rss:>14.0f}{'' if rss <= 1024 else '  MISSED <= 1024'}"
            )
            shutil.rmtree(out.parent)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small run (20,000 spans)")
    ap.add_argument("--files", action="store_true", help="only the Chrome/Jaeger JSON files")
    ap.add_argument("--steps", type=int, default=2, help="--files: nvl72 steps (1.84M spans each)")
    args = ap.parse_args()
    if args.files:
        bench_files(args.steps, args.quick)
        return
    n = 20_000 if args.quick else 300_000
    n_sdk = 10_000 if args.quick else 60_000  # the SDK path is ~20x slower: keep the run short

    import chiptrace

    trace_dir = synthetic_span_dir(n)
    con = chiptrace.connect(trace_dir)
    sdk_table = con.sql(f"SELECT * FROM spans_raw LIMIT {n_sdk}").to_arrow_table()
    recv = Receiver()
    try:
        http_rate, http_n = bench_chiptrace(trace_dir, recv.http, recv)
        grpc_rate, grpc_n = bench_chiptrace(trace_dir, recv.grpc, recv)
        sdk_rate, sdk_n = bench_sdk(sdk_table, recv.http, recv)
    finally:
        recv.stop()
    enc_ours, enc_sdk = bench_encoders(sdk_table)

    print(f"OTLP export to a loopback receiver (emulator-like spans, {BATCH} spans/request)")
    print(f"{'path':<58}{'spans':>10}{'spans/s':>12}")
    print(
        f"{'chiptrace export, HTTP/protobuf (Parquet->DuckDB->wire)':<58}{http_n:>10,}{http_rate:>12,.0f}"
    )
    print(f"{'chiptrace export, gRPC':<58}{grpc_n:>10,}{grpc_rate:>12,.0f}")
    print(
        f"{'OTel SDK: ReadableSpans -> OTLPSpanExporter (HTTP)':<58}{sdk_n:>10,}{sdk_rate:>12,.0f}"
    )
    print(
        f"ratio chiptrace/SDK over HTTP: {http_rate / sdk_rate:.1f}x  (target >= 50,000 spans/s: "
        f"{'met' if http_rate >= 50_000 else 'NOT met'})"
    )
    print(
        f"encoders alone on {sdk_table.num_rows:,} spans: chiptrace {enc_ours:,.0f} spans/s, "
        f"SDK (ReadableSpan + encode_spans) {enc_sdk:,.0f} spans/s, ratio {enc_ours / enc_sdk:.1f}x"
    )


if __name__ == "__main__":
    main()
