"""`chiptrace collect --listen HOST:PORT [--grpc HOST:PORT] --out DIR`: an OTLP receiver
that stores any OpenTelemetry SDK's spans in chiptrace's Parquet layout."""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

NAME = "collect"
ORDER = 70
HELP = "receive OTLP (HTTP, gRPC) from any OpenTelemetry SDK into a trace dir"
DESCRIPTION = (
    "Receive OTLP traces (HTTP protobuf or JSON, gzip, chunked; gRPC with --grpc) and store "
    "them as Parquet parts in DIR, the same layout chiptrace writes. A request is acknowledged "
    "only when its spans will be stored; otherwise it gets 503 with Retry-After and the client "
    "retries. Runs until SIGTERM or Ctrl-C, then writes every acknowledged span. "
    "See docs/collect.md."
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
        "--flush-interval",
        type=float,
        metavar="S",
        help="seconds between parts (default 2; 30 with --partition-by: a part is a file per partition)",
    )
    p.add_argument(
        "--flush-spans", type=int, default=200_000, metavar="N", help="spans per part at most"
    )
    p.add_argument(
        "--max-buffered",
        type=int,
        default=2_000_000,
        metavar="N",
        help="spans held before requests wait, then get 503 (default 2,000,000)",
    )
    p.add_argument(
        "--max-memory-mb",
        type=int,
        default=1024,
        metavar="MB",
        help="memory ceiling: requests, buffered spans and caches stay within it (default 1024)",
    )
    p.add_argument(
        "--min-free-mb",
        type=int,
        default=64,
        metavar="MB",
        help="refuse spans (503) that would leave less free disk than this (default 64)",
    )
    p.add_argument(
        "--read-timeout",
        type=float,
        default=30.0,
        metavar="S",
        help="close an HTTP connection that sends nothing for S seconds (default 30)",
    )
    p.add_argument(
        "--header-timeout",
        type=float,
        default=10.0,
        metavar="S",
        help="a request's headers must arrive within S seconds of their first byte (default 10)",
    )
    p.add_argument(
        "--min-body-rate",
        type=int,
        default=1000,
        metavar="B",
        help="a body must average B bytes a second after its first 10 s (default 1000)",
    )
    p.add_argument(
        "--max-connections",
        type=int,
        default=1024,
        metavar="N",
        help="HTTP connections open at once; more get 503 (default 1024)",
    )
    p.add_argument(
        "--max-connections-per-client",
        type=int,
        metavar="N",
        help="of those, from one client address (default a quarter of --max-connections)",
    )


def options(args: argparse.Namespace) -> Any:
    """The CollectOptions the flags describe (checked when the Collector is built)."""
    from pathlib import Path

    from chiptrace.collector.service import CollectOptions
    from chiptrace.collector.sink import parse_partition_by

    return CollectOptions(
        out=Path(args.out),
        http=None if args.listen.lower() == "none" else args.listen,
        grpc=args.grpc,
        partition_by=parse_partition_by(args.partition_by),
        max_request_bytes=args.max_request_bytes,
        flush_interval_s=args.flush_interval,
        flush_spans=args.flush_spans,
        max_buffered=args.max_buffered,
        max_memory=args.max_memory_mb << 20,
        min_free_bytes=args.min_free_mb << 20,
        read_timeout_s=args.read_timeout,
        header_timeout_s=args.header_timeout,
        min_body_rate=args.min_body_rate,
        max_connections=args.max_connections,
        max_connections_per_client=args.max_connections_per_client,
        manifest={"service": "chiptrace-collect", "source": "collect"},
    )


def run(args: argparse.Namespace) -> int:
    from chiptrace.collector.budget import limit_allocator_retention
    from chiptrace.collector.service import Collector, StopFlag, stop_on_signals

    limit_allocator_retention()
    collector = Collector(options(args))  # checks every flag before a file is written
    stop = StopFlag()
    stop_on_signals(stop)
    collector.start()
    r = collector.receiver
    where = [u for u in (r.http_url, r.grpc_target and f"grpc://{r.grpc_target}") if u]
    print(f"collecting OTLP on {' and '.join(where)} into {args.out}", flush=True)
    try:
        # Poll: a signal the kernel hands to another thread would never wake a blocking
        # wait (the handler runs only when the main thread runs bytecode again).
        while not stop.requested:
            time.sleep(0.2)
    finally:
        summary = collector.stop()  # no new acknowledgements, then everything acknowledged written
    print(summary.line(), file=sys.stderr)
    return 1 if summary.unwritten else 0
