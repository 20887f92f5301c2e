"""`chiptrace diff A B`: what changed between two runs, per metric and per finding."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

NAME = "diff"
ORDER = 31
HELP = "compare two runs: metrics side by side, findings new, worse, resolved"
DESCRIPTION = (
    "Compare run B against baseline A. Each side is a trace dir (analysed now) or a JSON file "
    "saved from `chiptrace report --json`."
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("a", metavar="A", help="baseline: trace dir or report JSON")
    p.add_argument("b", metavar="B", help="the run to compare: trace dir or report JSON")
    p.add_argument("--json", action="store_true", help="print the diff as JSON")
    p.add_argument("--all", action="store_true", help="list unchanged metrics too")


def load_side(path: str) -> dict[str, Any]:
    """A report dict from a trace dir or from a saved `report --json` file."""
    from chiptrace.analysis import TraceAnalysis
    from chiptrace.cli._runs import check_given
    from chiptrace.errors import ChiptraceError

    p = Path(path)
    if p.is_file() and p.suffix == ".json":
        try:
            data = json.loads(p.read_text())
        except (OSError, ValueError) as e:
            raise ChiptraceError(f"{path}: not a readable report JSON ({e})") from e
        if not isinstance(data, dict) or "metrics" not in data or "findings" not in data:
            check_given([path], "diff", several=False, run_flag=False)  # a trace file?
            raise ChiptraceError(
                f"{path}: expected `chiptrace report --json` output (keys metrics, findings)"
            )
        return data
    check_given([path], "diff", several=False, run_flag=False)
    return TraceAnalysis(path).report().to_dict()


def run(args: argparse.Namespace) -> int:
    from chiptrace.analysis import diff_reports
    from chiptrace.analysis.render_text import render_diff

    d = diff_reports(load_side(args.a), load_side(args.b))
    if args.json:
        sys.stdout.write(json.dumps(d, indent=1, default=str) + "\n")
    else:
        sys.stdout.write(render_diff(d, all_metrics=args.all))
    return 0
