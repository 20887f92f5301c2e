"""`chiptrace view`: the live terminal viewer over a trace dir or an OTLP/HTTP endpoint."""

from __future__ import annotations

import argparse
import glob
import sys
import threading
import time
from pathlib import Path
from typing import Any

from chiptrace.errors import ChiptraceError, StoreError

NAME = "view"
ORDER = 20
HELP = "watch chips, links and bottlenecks live in a terminal UI (trace dir or OTLP)"
DESCRIPTION = (
    "Open the live viewer: load per chip type and per link, bottleneck alerts, the slowest "
    "ops, a trace waterfall with the critical path, and a SQL console. Follows DIR as parts "
    "land, replays it with --replay, or receives OTLP/HTTP with --otlp."
)
DEFAULT_OTLP = "127.0.0.1:4318"


class ViewArgumentError(ChiptraceError):
    """Arguments that do not name a source."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("dir", nargs="?", metavar="DIR", help="trace dir to follow (may not exist yet)")
    p.add_argument(
        "--otlp",
        nargs="?",
        const=DEFAULT_OTLP,
        metavar="HOST:PORT",
        help=f"receive OTLP/HTTP spans (default {DEFAULT_OTLP})",
    )
    p.add_argument("--out", metavar="DIR", help="with --otlp: also store the spans in DIR")
    p.add_argument(
        "--replay",
        nargs="?",
        type=float,
        const=1.0,
        metavar="SPEED",
        help="replay a finished trace paced to wall time (SPEED x real time)",
    )
    p.add_argument("--window-ms", type=float, metavar="MS", help="initial dashboard window")
    from chiptrace.cli._runs import add_run_argument

    add_run_argument(p)
    p.add_argument("--no-ui", action="store_true", help="print the dashboard once as text and exit")
    p.add_argument(
        "--screenshot",
        metavar="FILE.svg",
        help="render the dashboard headless once DIR is read, save it as SVG, exit",
    )


def run(args: argparse.Namespace) -> int:
    window_ns = int(args.window_ms * 1e6) if args.window_ms else None
    if args.window_ms is not None and args.window_ms <= 0:
        raise ViewArgumentError(f"--window-ms {args.window_ms}: expected a positive number")
    if args.otlp:
        return _run_otlp(args, window_ns)
    if not args.dir:
        raise ViewArgumentError(
            "give a trace DIR to follow, or --otlp [HOST:PORT] to receive spans"
        )
    from chiptrace.cli._runs import check_given, pick

    directory = Path(args.dir)
    if args.run:  # one of the runs in DIR (or DIR itself, or the glob's)
        inside = directory.is_dir() and not (directory / "spans").is_dir()
        found = pick([str(directory / "*") if inside else str(directory)], args.run, "view")
        directory = Path(found[0].dirs[0])
    else:
        check_given([args.dir], "view", several=False)
        runs = pick([args.dir], None, "view") if glob.has_magic(args.dir) else []
        if len(runs) > 1:  # the viewer follows one run
            listed = "; ".join(r.describe() for r in runs)
            raise ViewArgumentError(f"{args.dir}: {len(runs)} runs ({listed}): add --run ID")
        if runs:
            directory = Path(runs[0].dirs[0])
    if directory.exists() and not directory.is_dir():
        raise StoreError(f"{args.dir}: expected a trace directory, not a file")
    if args.replay is not None and args.replay <= 0:
        raise ViewArgumentError(f"--replay {args.replay}: expected a positive speed")
    from chiptrace.viewer.launch import dir_app, save_screenshot, summarize_dir

    if args.screenshot:
        if not directory.is_dir():
            raise StoreError(f"trace dir {args.dir!r} does not exist")
        path = save_screenshot(dir_app(directory, window_ns=window_ns), args.screenshot)
        print(f"chiptrace: dashboard saved to {path}")
        return 0
    if args.no_ui or not sys.stdout.isatty():
        if not directory.is_dir():
            raise StoreError(f"trace dir {args.dir!r} does not exist")
        print(summarize_dir(directory, window_ns))
        return 0
    dir_app(directory, replay=args.replay, window_ns=window_ns).run()
    return 0


def _run_otlp(args: argparse.Namespace, window_ns: int | None) -> int:
    from chiptrace.collector.budget import limit_allocator_retention
    from chiptrace.collector.service import StopFlag, stop_on_signals
    from chiptrace.viewer.otlp import OtlpSource, parse_address

    host, port = parse_address(args.otlp)
    limit_allocator_retention()
    stop = StopFlag()
    stop_on_signals(stop)  # SIGTERM too: every acknowledged span is stored before exit
    source = OtlpSource(host, port, out=args.out)
    try:
        if args.no_ui or not sys.stdout.isatty():
            source.serve_summary(window_ns, stop)
        else:
            from chiptrace.viewer.app import ViewerApp

            app = ViewerApp([source], feed=source.feed, window_ns=window_ns)
            threading.Thread(target=_exit_when, args=(stop, app), daemon=True).start()
            app.run()
    finally:
        summary = source.stop()
    if args.out:
        print(f"chiptrace: {summary.line()} into {args.out}", file=sys.stderr)
    return 1 if summary.unwritten else 0


def _exit_when(stop: Any, app: Any) -> None:
    """Close the app once a signal asked to stop (the app runs in the main thread)."""
    while not stop.requested:
        time.sleep(0.2)
    try:
        app.call_from_thread(app.exit)
    except RuntimeError:  # the app already ended
        pass
