"""`chiptrace report DIR...`: ranked bottlenecks, critical path, utilization, MFU."""

from __future__ import annotations

import argparse
import json
import sys

NAME = "report"
ORDER = 30
HELP = "find what holds a run back: ranked bottlenecks with evidence and suggestions"
DESCRIPTION = (
    "Analyse one run (one or more trace dirs, globs allowed): headline metrics, bottleneck "
    "findings over every workload ordered by severity and time at stake, each with what fixing "
    "it would save per step, the slowest step's critical path. "
    "--json prints the documented JSON (docs/sql.md, 'Report JSON'); --html writes a "
    "self-contained page with plots."
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("dirs", nargs="+", metavar="DIR", help="trace dir(s) or glob(s) of one run")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--html", metavar="FILE", help="also write a self-contained HTML report")
    p.add_argument("--since-ns", type=int, help="analyse spans from this Unix time (ns)")
    p.add_argument("--until-ns", type=int, help="analyse spans until this Unix time (ns)")
    p.add_argument(
        "--step",
        metavar="GLOB",
        help="span names that mark a step, any level: 'ProfilerStep#*', 'GET /*' "
        "(default: guessed, and the report says which and why)",
    )
    p.add_argument(
        "--sample-steps",
        type=int,
        default=5,
        metavar="N",
        help="steps analysed span by span (critical path, overlap); default 5",
    )
    from chiptrace.cli._runs import add_run_argument

    add_run_argument(p)
    p.add_argument(
        "--max-step-spans",
        type=int,
        default=400_000,
        metavar="N",
        help="skip span-by-span analysis of steps bigger than this (default 400000)",
    )


def write_text(path: str, text: str) -> None:
    """Write `text` to `path`, turning OS errors into a one-line ChiptraceError."""
    from chiptrace.errors import ChiptraceError

    try:
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(text)
    except OSError as e:
        raise ChiptraceError(f"cannot write {path}: {e.strerror}") from e


def run(args: argparse.Namespace) -> int:
    from chiptrace.analysis import TraceAnalysis
    from chiptrace.analysis.render_html import render_html
    from chiptrace.analysis.render_text import render_report
    from chiptrace.cli._runs import pick
    from chiptrace.errors import ChiptraceError

    if args.sample_steps < 0:
        raise ChiptraceError(f"--sample-steps {args.sample_steps}: expected 0 or more")
    runs = pick(args.dirs, args.run, "report")
    if len(runs) > 1:  # several runs are never one report: each of them, said so
        if args.json or args.html:
            listed = "; ".join(r.describe() for r in runs)
            raise ChiptraceError(f"{len(runs)} runs given ({listed}): add --run ID for one")
        for no, r in enumerate(runs):
            sys.stdout.write(("\n" if no else "") + f"== run {no + 1} of {len(runs)}: ")
            sys.stdout.write(r.describe() + "\n")
            args.dirs, args.run = list(r.dirs), r.id
            run(args)
        return 0
    ta = TraceAnalysis(
        list(runs[0].paths),
        since_ns=args.since_ns,
        until_ns=args.until_ns,
        step_name=args.step,
        sample_steps=args.sample_steps,
        max_step_spans=args.max_step_spans,
    )
    report = ta.report().to_dict()
    if args.html:
        write_text(args.html, render_html(report))
    if args.json:
        sys.stdout.write(json.dumps(report, indent=1, default=str) + "\n")
    else:
        sys.stdout.write(render_report(report))
        if args.html:
            sys.stdout.write(f"\nHTML report: {args.html}\n")
    return 0
