"""`chiptrace import FILE|DIR... --out DIR`: PyTorch profiler, Chrome, OTLP, Jaeger files in."""

from __future__ import annotations

import argparse
import sys
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
        "at most 4, for 48 MB of Kineto files or more; 0: none); with --dask local: the "
        "LocalCluster's worker processes (default 2)",
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
    p.add_argument(
        "--dask",
        metavar="ADDRESS",
        help="run on a Dask cluster: its scheduler (tcp://host:8786), or `local` for a "
        "LocalCluster of --workers processes; default $CHIPTRACE_DASK_SCHEDULER. The inputs "
        "and --out must be on storage every worker sees (see docs/scaling.md)",
    )
    p.add_argument(
        "--partition-by",
        choices=("rank",),
        help="write parts under spans/rank=R/ (hive layout): a distributed report's task "
        "then reads only its rank's",
    )


def run(args: argparse.Namespace) -> int:
    import json

    from chiptrace.cli._progress import Bar
    from chiptrace.cli.emulate import check_out
    from chiptrace.cluster.client import address_from

    check_out(args.out, args.append)
    bar = Bar("importing")
    address = address_from(args.dask)
    try:
        if address is None:
            summary = _import(args, bar, None)
        else:
            summary = _on_cluster(args, bar, address)
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


def _import(args: argparse.Namespace, bar: Any, executor: Any) -> Any:
    from chiptrace.importers import import_trace

    def on_bytes(done: int, total: int) -> None:
        bar.update(done / total if total else 1.0, done=done >> 20, total=total >> 20, unit="MiB")

    def on_task(p: Any) -> None:
        bar.update(p.tasks_done / p.tasks, done=p.files_done, total=p.files, spans=p.spans)

    return import_trace(
        args.paths,
        args.out,
        format=args.format,
        align=args.align,
        progress=on_bytes if bar.on else None,
        workers=args.workers if executor is None else None,
        executor=executor,
        partition_by=args.partition_by,
        on_task=on_task if bar.on else None,
        merge=args.merge,
    )


def _on_cluster(args: argparse.Namespace, bar: Any, address: str) -> Any:
    """Connect (nothing is written before), check every worker sees the inputs and --out,
    then import; --out is removed again if this made it and the check failed."""
    from pathlib import Path

    from chiptrace.cluster.client import Cluster, note
    from chiptrace.importers import expand_inputs

    files = [f.resolve() for f in expand_inputs(args.paths)]
    with Cluster(address, workers=args.workers) as cluster:
        out = Path(args.out).resolve()
        made = not out.exists()
        out.mkdir(parents=True, exist_ok=True)
        try:
            cluster.check_paths(files, out)
        except BaseException:
            if made and not any(out.iterdir()):
                out.rmdir()
            raise
        dash = cluster.dashboard()
        note(
            f"Dask: {cluster.workers} workers at {address}"
            + (f", dashboard {dash}" if dash else "")
        )
        return _import(args, bar, cluster)


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
