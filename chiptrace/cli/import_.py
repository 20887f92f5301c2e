"""`chiptrace import FILE|DIR... --out DIR`: PyTorch profiler, Chrome, OTLP, Jaeger files in."""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

NAME = "import"
ORDER = 15
HELP = "import PyTorch profiler (Kineto), Chrome, OTLP or Jaeger trace files into a trace dir"
DESCRIPTION = (
    "Read trace files made elsewhere (.json or .json.gz; one file per rank is usual, folders "
    "are searched for them) into a trace dir, so query, report, view, export and diff work "
    "on them. The format is detected from each file's content. See docs/import.md."
)
FORMATS = ("auto", "kineto", "chrome", "otlp-json", "jaeger-json")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("paths", nargs="+", metavar="FILE|DIR", help="trace files, or folders of them")
    p.add_argument("--out", "-o", required=True, metavar="DIR", help="trace dir to write into")
    p.add_argument("--format", "-f", choices=FORMATS, default="auto", help="default: detect")
    p.add_argument(
        "--align",
        choices=("auto", "nccl", "none"),
        default="auto",
        help="align rank clocks on the ends of their NCCL collectives "
        "(auto: where two or more ranks have them)",
    )
    p.add_argument(
        "--workers",
        type=int,
        metavar="N",
        help="processes decoding Kineto files beside this one (default: one per idle CPU, "
        "at most 4, for 48 MB of Kineto files or more; 0: none)",
    )
    p.add_argument(
        "--append",
        action="store_true",
        help="add this import to an --out that already holds a trace (a run of its own)",
    )
    p.add_argument(
        "--merge",
        action="store_true",
        help="store files that look like different jobs (duplicate ranks, different world "
        "sizes, clocks hours apart) as one run",
    )
    p.add_argument("--json", action="store_true", help="print the import summary as JSON")


class _Bar:
    """A one-line progress bar on stderr, drawn only when stderr is a terminal."""

    def __init__(self) -> None:
        self.on = sys.stderr.isatty()
        self._last = 0.0

    def __call__(self, done: int, total: int) -> None:
        now = time.monotonic()
        if not self.on or (now - self._last < 0.1 and done < total):
            return
        self._last = now
        frac = done / total if total else 1.0
        bar = "#" * int(frac * 30)
        sys.stderr.write(f"\rimporting [{bar:<30}] {frac:4.0%}")
        sys.stderr.flush()

    def close(self) -> None:
        if self.on:
            sys.stderr.write("\r" + " " * 50 + "\r")


def run(args: argparse.Namespace) -> int:
    import json

    from chiptrace.cli.emulate import check_out
    from chiptrace.importers import import_trace

    check_out(args.out, args.append)
    bar = _Bar()
    try:
        summary = import_trace(
            args.paths,
            args.out,
            format=args.format,
            align=args.align,
            progress=bar if bar.on else None,
            workers=args.workers,
            merge=args.merge,
        )
    finally:
        bar.close()
    _warn(summary.files)
    if args.json:
        sys.stdout.write(json.dumps(summary.as_dict(), indent=1) + "\n")
    if not summary.spans:  # an empty store is no trace: say why, and fail
        sys.stderr.write(f"chiptrace: error: {_why_empty(summary.files)}; nothing stored\n")
        return 1
    if args.json:
        return 0
    out = sys.stdout
    for f in summary.files:
        rank = f" rank {f['rank']}" if "rank" in f else ""
        skipped = sum(f["skipped"].values())
        extra = f", {skipped} events skipped ({_reasons(f['skipped'])})" if skipped else ""
        out.write(f"{f['path']}: {f['format']}{rank}, {f['spans']} spans{extra}\n")
    for path, off in summary.offsets_ns.items():
        out.write(f"clock of {path} shifted by {off / 1000:+.0f} us (aligned on NCCL)\n")
    out.write(
        f"stored {summary.spans} spans in {summary.out} ({summary.seconds:.1f} s)\n"
        f"next: chiptrace report {summary.out}\n"
    )
    return 0


def _reasons(skipped: dict[str, int]) -> str:
    return ", ".join(f"{n} {why}" for why, n in sorted(skipped.items(), key=lambda kv: -kv[1]))


def _warn(files: list[dict[str, Any]]) -> None:
    """Files loaded in part, categories mapped to no chip: on stderr, whatever the output."""
    for f in files:
        for warning in f.get("warnings", []):
            sys.stderr.write(f"warning: {f['path']}: {warning}\n")
        for cat, n in f.get("unrecognised", {}).items():
            sys.stderr.write(
                f"warning: {f['path']}: {n} events of unrecognised category {cat!r} "
                "stored as host work on cpu:0\n"
            )


def _why_empty(files: list[dict[str, Any]]) -> str:
    """Why no span was stored: what each file held instead."""
    parts = []
    for f in files:
        skipped = f.get("skipped", {})
        held = f"{f.get('events', 0)} events" if f.get("events") else "no events"
        extra = f" ({_reasons(skipped)} skipped)" if skipped else ""
        parts.append(f"{f['path']}: {held}{extra}")
    kinds = "complete (X) or begin/end (B/E) events, or spans"
    return f"0 spans: no file held {kinds}; " + "; ".join(parts)
