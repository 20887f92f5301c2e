"""`chiptrace collect --listen HOST:PORT [--grpc HOST:PORT] --out DIR`: an OTLP receiver
that stores any OpenTelemetry SDK's spans in chiptrace's Parquet layout."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from typing import Any

NAME = "collect"
ORDER = 70
HELP = "receive OTLP (HTTP, gRPC) from any OpenTelemetry SDK into a trace dir"
DESCRIPTION = (
    "Receive OTLP traces (HTTP protobuf or JSON, gzip; gRPC with --grpc) and store them as "
    "Parquet parts in DIR, the same layout chiptrace writes. Runs until SIGTERM or Ctrl-C, "
    "then flushes every acknowledged span. See docs/scaling.md."
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--listen",
        default="127.0.0.1:4318",
        metavar="HOST:PORT",
        help="OTLP/HTTP address (default 127.0.0.1:4318; 'none' for no HTTP)",
    )
    p.add_argument(
        "--grpc", metavar="HOST:PORT", help="also serve OTLP/gRPC here (e.g. 127.0.0.1:4317)"
    )
    p.add_argument("--out", required=True, metavar="DIR", help="trace dir to write")
    p.add_argument(
        "--partition-by",
        metavar="KEYS",
        help="hive partitions: date, host, service (comma-separated)",
    )
    p.add_argument(
        "--max-request-bytes",
        type=int,
        default=16 << 20,
        metavar="N",
        help="larger requests get 413 (default 16 MiB)",
    )
    p.add_argument(
        "--flush-interval", type=float, default=2.0, metavar="S", help="seconds between parts"
    )
    p.add_argument(
        "--flush-spans", type=int, default=200_000, metavar="N", help="spans per part at most"
    )
    p.add_argument(
        "--max-buffered",
        type=int,
        default=2_000_000,
        metavar="N",
        help="spans held before clients are slowed (503 once full)",
    )


def build(args: argparse.Namespace) -> tuple[Any, Any]:
    """The recorder writing DIR and the receiver feeding it (not started)."""
    from chiptrace.collector.receiver import OtlpReceiver, parse_address
    from chiptrace.collector.sink import PartitionedStoreSink, parse_partition_by
    from chiptrace.config import resolve
    from chiptrace.recorder import Recorder
    from chiptrace.store import PartWriter

    partition_by = parse_partition_by(args.partition_by)
    http = None if args.listen.lower() == "none" else args.listen
    for flag, addr, port in (("--listen", http, 4318), ("--grpc", args.grpc, 4317)):
        if addr:
            parse_address(flag, addr, port)  # fail before any file is written
    cfg = resolve(
        dir=args.out,
        service="chiptrace-collect",
        flush_interval_s=args.flush_interval,
        flush_spans=args.flush_spans,
        max_buffered=args.max_buffered,
        otlp_endpoint="",
    )
    writer = PartWriter(
        cfg.dir,
        manifest={
            "service": "chiptrace-collect",
            "source": "collect",
            "partition_by": list(partition_by),
        },
    )
    recorder = Recorder(cfg, [PartitionedStoreSink(writer, partition_by)], writer)

    def on_batch(batch: Any) -> bool:
        # block: a full buffer slows the senders (their retries) rather than dropping.
        return recorder.write_batch(batch, block=True)

    receiver = OtlpReceiver(
        on_batch, http=http, grpc=args.grpc, max_request_bytes=args.max_request_bytes
    )
    return recorder, receiver


def run(args: argparse.Namespace) -> int:
    recorder, receiver = build(args)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    try:
        receiver.start()
    except BaseException:
        recorder.shutdown()
        raise
    where = (
        [f"http://{receiver._http_addr[0]}:{receiver.http_port}/v1/traces"]
        if receiver.http_port
        else []
    )
    if receiver.grpc_port:
        where.append(f"grpc://{receiver._grpc_addr[0]}:{receiver.grpc_port}")
    print(f"collecting OTLP on {' and '.join(where)} into {args.out}", flush=True)
    try:
        # Poll: a signal the kernel hands to another thread would never wake a plain wait()
        # (the handler runs only when the main thread runs bytecode again).
        while not stop.wait(0.2):
            pass
    finally:
        receiver.stop()  # no new acknowledgements from here on
        recorder.shutdown()  # writes everything acknowledged
    s = receiver.stats
    print(
        f"stored {s.spans:,} spans from {s.requests:,} requests "
        f"({s.rejected} rejected, {s.errors} bad requests); {recorder.dropped} dropped",
        file=sys.stderr,
    )
    return 0
