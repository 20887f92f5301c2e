"""`chiptrace report DIR...`: ranked bottlenecks, critical path, utilization, MFU."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

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
    _add_cluster(p)


def _add_cluster(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--dask",
        metavar="ADDRESS",
        help="run the per-rank and per-step stages as tasks on a Dask cluster: its "
        "scheduler (tcp://host:8786), or `local` for a LocalCluster of --workers processes; "
        "default $CHIPTRACE_DASK_SCHEDULER. The trace dirs must be on storage every worker "
        "sees; the JSON is the single-process report's (see docs/scaling.md)",
    )
    p.add_argument(
        "--workers", type=int, metavar="N", help="with --dask local: worker processes (default 2)"
    )


def write_text(path: str, text: str) -> None:
    """Write `text` to `path`, turning OS errors into a one-line ChiptraceError."""
    from chiptrace.errors import ChiptraceError

    try:
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(text)
    except OSError as e:
        raise ChiptraceError(f"cannot write {path}: {e.strerror}") from e


def _on_cluster(args: argparse.Namespace, address: str, analyse: Any) -> dict[str, Any]:
    """Connect, check every worker sees the trace dirs, then analyse with the stages as
    Dask tasks (a progress bar of them on a terminal)."""
    from pathlib import Path

    from chiptrace.cli._progress import Bar
    from chiptrace.cluster.client import Cluster, note
    from chiptrace.cluster.reports import DaskRunner
    from chiptrace.store import expand_dirs

    dirs = [Path(d).resolve() for d in expand_dirs(args.dirs)]
    with Cluster(address, workers=args.workers) as cluster:
        cluster.check_paths(dirs)
        dash = cluster.dashboard()
        note(
            f"Dask: {cluster.workers} workers at {address}"
            + (f", dashboard {dash}" if dash else "")
        )
        bar = Bar("reporting")
        try:
            return analyse(DaskRunner(cluster, _stages_bar(bar)))
        finally:
            bar.close()


def _stages_bar(bar: Any) -> Any:
    """The report's progress: stages done of those handed out so far (per rank, per step)."""
    return lambda done, total: bar.update(done / total, done=done, total=total, unit="stages")


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
    from chiptrace.cluster.client import address_from

    def analyse(runner: Any = None) -> dict[str, Any]:
        ta = TraceAnalysis(
            list(runs[0].paths),
            since_ns=args.since_ns,
            until_ns=args.until_ns,
            step_name=args.step,
            sample_steps=args.sample_steps,
            max_step_spans=args.max_step_spans,
            runner=runner,
        )
        return ta.report().to_dict()

    address = address_from(args.dask)
    if address is None:
        from chiptrace.analysis.stages import InProcess
        from chiptrace.cli._progress import Bar

        bar = Bar("reporting")
        try:
            report = analyse(InProcess(_stages_bar(bar)) if bar.on else None)
        finally:
            bar.close()
    else:
        report = _on_cluster(args, address, analyse)
    if args.html:
        write_text(args.html, render_html(report))
    if args.json:
        sys.stdout.write(json.dumps(report, indent=1, default=str) + "\n")
    else:
        sys.stdout.write(render_report(report))
        if args.html:
            sys.stdout.write(f"\nHTML report: {args.html}\n")
    return 0
