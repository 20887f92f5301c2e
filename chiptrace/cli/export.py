"""`chiptrace export DIR... --otlp URL | --format jaeger-json|chrome -o FILE`."""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

NAME = "export"
ORDER = 60
HELP = "send a trace to Jaeger (OTLP) or write Jaeger JSON / Chrome (Perfetto) JSON"
DESCRIPTION = (
    "Export the spans of trace dirs: to an OTLP endpoint (Jaeger, an OpenTelemetry "
    "Collector) over HTTP/protobuf (http://host:4318) or gRPC (grpc://host:4317), or to a "
    "file the Jaeger UI (--format jaeger-json) or Perfetto / chrome://tracing (--format "
    "chrome) opens. OTEL_EXPORTER_OTLP_{,TRACES_}{ENDPOINT,HEADERS,COMPRESSION,TIMEOUT} are "
    "honoured. See docs/jaeger.md."
)
FORMATS = ("otlp", "jaeger-json", "chrome")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("dirs", nargs="+", metavar="DIR", help="trace dir(s) or glob(s)")
    p.add_argument(
        "--otlp",
        nargs="?",
        const="",
        metavar="URL",
        help="send over OTLP to URL (default: OTEL_EXPORTER_OTLP_ENDPOINT or http://localhost:4318)",
    )
    p.add_argument("--format", "-f", choices=FORMATS, help="output format (default: otlp)")
    p.add_argument(
        "-o", "--output", metavar="FILE", help="file for jaeger-json / chrome ('-' = stdout)"
    )
    p.add_argument(
        "--split-mb",
        type=float,
        metavar="N",
        help="a document past N MB becomes FILE-001.json, FILE-002.json, ... each loadable "
        "alone; jaeger-json: whole traces (default 400: the Jaeger UI fails past about 530 MB); "
        "chrome: windows of time (default 200: chrome://tracing fails past about 256 MB); "
        "0: one file",
    )
    g = p.add_argument_group("which spans")
    g.add_argument(
        "--trace-id",
        action="append",
        default=[],
        metavar="HEX",
        help="only this trace (repeatable)",
    )
    g.add_argument(
        "--since", metavar="TIME", help="spans starting at/after TIME (Unix ns or ISO 8601)"
    )
    g.add_argument("--until", metavar="TIME", help="spans starting before TIME")
    g.add_argument("--where", metavar="SQL", help="SQL condition over spans_raw columns")
    o = p.add_argument_group("OTLP")
    o.add_argument(
        "--header", action="append", default=[], metavar="K=V", help="request header (repeatable)"
    )
    o.add_argument(
        "--compression",
        choices=("gzip", "none"),
        help="default: OTEL_EXPORTER_OTLP_COMPRESSION or none",
    )
    o.add_argument(
        "--timeout", type=float, metavar="S", help="per-request timeout in seconds (default 10)"
    )
    o.add_argument("--batch-size", type=int, default=2048, metavar="N", help="spans per request")
    o.add_argument(
        "--retries", type=int, default=5, metavar="N", help="retries of a failed request"
    )
    o.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")


class Progress:
    """A one-line progress bar on stderr, redrawn at most ten times a second."""

    def __init__(self, total: int, enabled: bool) -> None:
        self.total, self.done, self.enabled = total, 0, enabled
        self.t0 = self._last = time.monotonic()

    def __call__(self, n: int) -> None:
        self.done += n
        now = time.monotonic()
        if self.enabled and (now - self._last >= 0.1 or self.done >= self.total):
            self._last = now
            frac = self.done / self.total if self.total else 1.0
            bar = "#" * int(frac * 30)
            rate = self.done / max(now - self.t0, 1e-9)
            sys.stderr.write(
                f"\rexport [{bar:<30}] {self.done:,}/{self.total:,} spans {rate:,.0f}/s"
            )
            sys.stderr.flush()

    def end(self) -> None:
        if self.enabled:
            sys.stderr.write("\n")


def _filter(args: argparse.Namespace) -> Any:
    from chiptrace.exporters.source import SpanFilter, parse_time, parse_trace_id

    return SpanFilter(
        trace_ids=tuple(parse_trace_id(t) for t in args.trace_id),
        since_ns=parse_time("--since", args.since) if args.since else None,
        until_ns=parse_time("--until", args.until) if args.until else None,
        where=args.where,
    )


def _otlp(args: argparse.Namespace, source: Any) -> int:
    from chiptrace.errors import ConfigError
    from chiptrace.exporters.otlp import export_batches
    from chiptrace.exporters.otlp_config import parse_headers, resolve

    if args.batch_size < 1 or args.retries < 0:
        raise ConfigError("--batch-size must be >= 1 and --retries >= 0")
    settings = resolve(
        args.otlp or None,
        headers=parse_headers("--header", ",".join(args.header)) if args.header else None,
        compression=args.compression,
        timeout_s=args.timeout,
    )
    bar = Progress(source.count, not args.no_progress and sys.stderr.isatty())
    try:
        result = export_batches(
            source.batches(),
            settings,
            total=source.count,
            batch_spans=args.batch_size,
            retries=args.retries,
            progress=bar,
        )
    finally:
        bar.end()
    context = f" ({source.context:,} ancestors kept as context)" if source.context else ""
    print(
        f"sent {result.spans:,} spans{context} in {result.requests} requests to {result.url} "
        f"({result.seconds:.2f}s, {result.spans_per_s:,.0f} spans/s)"
        + (f"; receiver rejected {result.rejected}" if result.rejected else "")
    )
    return 0


def _file(args: argparse.Namespace, source: Any) -> int:
    from chiptrace.errors import ConfigError
    from chiptrace.exporters.chrome import DEFAULT_SPLIT_MB as CHROME_SPLIT_MB
    from chiptrace.exporters.chrome import write_chrome_json
    from chiptrace.exporters.jaeger import DEFAULT_SPLIT_MB, write_jaeger_json

    if not args.output:
        raise ConfigError(f"--format {args.format} needs -o FILE (or -o - for stdout)")
    context = f" ({source.context:,} ancestors kept as context)" if source.context else ""
    if args.format == "jaeger-json":
        split = DEFAULT_SPLIT_MB if args.split_mb is None else args.split_mb
        done = write_jaeger_json(source, args.output, split_mb=split)
        what = f"{source.count:,} spans in {done.traces} traces{context}"
        files = [str(f) for f in done.files]
        where = files[0] if len(files) == 1 else f"{files[0]} ... {files[-1]} ({len(files)} files)"
    else:
        split = CHROME_SPLIT_MB if args.split_mb is None else args.split_mb
        chrome = write_chrome_json(source, args.output, split_mb=split)
        what = f"{chrome.slices:,} spans{context}"
        files = [str(f) for f in chrome.files]
        where = files[0] if len(files) == 1 else f"{files[0]} ... {files[-1]} ({len(files)} files)"
    if args.output != "-":
        print(f"wrote {what} to {where}")
    return 0


def run(args: argparse.Namespace) -> int:
    from chiptrace.errors import ConfigError
    from chiptrace.exporters.source import SpanSource

    fmt = args.format or "otlp"
    if args.otlp is not None and fmt != "otlp":
        raise ConfigError(f"--otlp sends OTLP; it cannot be combined with --format {fmt}")
    if args.split_mb is not None and (fmt == "otlp" or args.split_mb < 0):
        raise ConfigError(
            f"--split-mb {args.split_mb:g}: expected MB >= 0, with --format jaeger-json or chrome"
        )
    source = SpanSource(args.dirs, _filter(args))
    if fmt == "otlp":
        return _otlp(args, source)
    return _file(args, source)
