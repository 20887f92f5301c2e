"""`chiptrace whatif DIR --speed gpu:3=2 --link pcie4=2x`: each step replayed with a change."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

NAME = "whatif"
ORDER = 32
HELP = "replay each step's dependency graph with chips or links faster: the step time after"
DESCRIPTION = (
    "Replay each step of a run (its dependency graph: work order per chip and link, "
    "transfers, collectives, launches, nesting) with a change, and print the step time "
    "before and after, per workload. Example: chiptrace whatif DIR --speed gpu:3=2 "
    "--link pcie4=2x --link nvlink6:gpu:4-switch:0=1800"
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("path", metavar="DIR", help="trace dir")
    p.add_argument(
        "--speed",
        action="append",
        default=[],
        metavar="CHIP=K",
        help="a chip (gpu:3) or every chip of a type (gpu) K times faster; repeatable",
    )
    p.add_argument(
        "--link",
        action="append",
        default=[],
        metavar="LINK=BW",
        help="a link id or link type at Kx its nominal bandwidth (pcie4=2x) or at GB/s "
        "per direction (pcie4=64); repeatable",
    )
    p.add_argument(
        "--undelay",
        action="append",
        default=[],
        metavar="CHIP",
        help="remove a chip's late starts against its peers (a straggler's delay); repeatable",
    )
    p.add_argument("--json", action="store_true", help="print the result as JSON")


def _rows(args: argparse.Namespace) -> list[dict[str, Any]]:
    from chiptrace.analysis import TraceAnalysis
    from chiptrace.analysis.serving import back_ends, evaluate
    from chiptrace.analysis.whatif import MAX_GRAPH_SPANS, Change
    from chiptrace.analysis.whatif_names import WhatIfError, parse_change

    ta = TraceAnalysis(args.path)
    t = ta.tables
    change = parse_change(
        t.topology,
        t.chips.column("chip_id").to_pylist(),
        t.links.column("link_id").to_pylist(),
        args.speed,
        args.link,
        args.undelay,
    )
    out = []
    for w in t.workloads:
        r = evaluate(ta.con, w.steps, t.topology, {"none": Change(), "change": change})
        if not r:
            raise WhatIfError(
                f"{args.path}: steps of {w.name} average over {MAX_GRAPH_SPANS:,} spans; "
                "replaying them is not supported yet"
            )
        base, new = r["none"], r["change"]
        out.append(
            {
                "step": w.name,
                "steps_replayed": new["steps"],
                "statistic": "mean" if back_ends(w.steps) else "p50",
                "measured_ms": round(base["measured_ns"] / 1e6, 4),
                "replayed_unchanged_ms": round(base["replayed_ns"] / 1e6, 4),
                "replayed_ms": round(new["replayed_ns"] / 1e6, 4),
                "saving_ms": round(new["saving_ns"] / 1e6, 4),
                "saving_pct": round(100 * new["saving_ns"] / base["measured_ns"], 2)
                if base["measured_ns"]
                else 0.0,
            }
        )
    return out


def run(args: argparse.Namespace) -> int:
    rows = _rows(args)
    if args.json:
        sys.stdout.write(json.dumps({"workloads": rows}, indent=1) + "\n")
        return 0
    if not rows:
        sys.stdout.write("no steps to replay\n")
    for r in rows:
        sys.stdout.write(
            f"{r['step']}: {r['steps_replayed']} steps, {r['statistic']} {r['measured_ms']:.3f} ms "
            "measured "
            f"({r['replayed_unchanged_ms']:.3f} replayed unchanged) -> {r['replayed_ms']:.3f} ms"
            f", saves {r['saving_ms']:.3f} ms ({r['saving_pct']:.1f}%)\n"
        )
    return 0
