"""`chiptrace demo`: the main job. Runs the default emulated rack and shows where time went.

The rack (`rack6`: GPUs, CPUs, DPUs, NPUs, NICs and switches) runs the `mixed` workload for
a few seconds, paced to wall time: GPUs train (input received by the NICs, forwarded by the
Ethernet switch, loaded by the CPUs, preprocessed by the DPUs; the all-reduce forwarded by
the NVLink switch) while the NPUs serve requests, so every chip type carries load. Its spans
go to a trace dir (`--workload train|infer` runs one workload alone). On a terminal it shows live in
the viewer (the emulation runs in a thread and feeds the viewer in-process); with --no-ui or
when stdout is not a terminal, a summary prints instead. `run_demo(...)` takes extra span
sinks, which is how the live view rides along.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

NAME = "demo"
ORDER = 0
HELP = "run a sample workload on the emulated rack and show where the time went"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--out", metavar="DIR", help="trace dir (default: ./chiptrace-traces/demo-<time>)"
    )
    p.add_argument(
        "--seconds", type=float, default=10.0, help="emulated seconds to run (paced to wall time)"
    )
    p.add_argument(
        "--steps", type=int, default=None, help="stop after this many training steps instead"
    )
    p.add_argument("--topology", default="rack6", help="preset or TOML path (default rack6)")
    p.add_argument(
        "--workload",
        default="mixed",
        help="mixed (default: train on GPUs + serve on NPUs, every chip type busy), train or infer",
    )
    p.add_argument(
        "--fault",
        action="append",
        default=[],
        metavar="KIND:TARGET[:VALUE]",
        help="inject a fault, e.g. slow:gpu:3:4 (repeatable)",
    )
    p.add_argument("--speed", type=float, default=1.0, help="emulated seconds per wall second")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--no-ui",
        action="store_true",
        help="print a summary instead of the live viewer (automatic when stdout is not a terminal)",
    )


def run_demo(
    out: str | Path,
    seconds: float | None = 10.0,
    sinks: Iterable[Any] = (),
    *,
    steps: int | None = None,
    topology: str = "rack6",
    workload: str = "mixed",
    faults: Sequence[str] = (),
    speed: float = 1.0,
    seed: int = 0,
) -> Any:
    """Run the demo emulation paced to wall time; returns the EmulationResult.

    Args:
        out: trace dir.
        seconds: emulated (and, at speed 1, wall) seconds to run.
        sinks: extra span sinks (a live viewer's feed) beside the store.
        steps: stop after this many steps instead (or as well).
    """
    from chiptrace.emulator import emulate

    return emulate(
        topology=topology,
        workload=workload,
        steps=steps,
        seed=seed,
        out=out,
        faults=faults,
        realtime=True,
        speed=speed,
        sinks=sinks,
        duration_s=seconds if steps is None else None,
        progress=False,
    )


SUMMARY_SQL = """
SELECT coalesce(chip_type, link_type, '-') AS on_, op_kind AS kind, count(*) AS spans,
       round(sum(duration_ns) / 1e6, 1) AS busy_ms,
       round(sum(op_bytes) FILTER (WHERE link_id IS NOT NULL) / 1e9, 2) AS moved_gb
FROM spans WHERE chip_id IS NOT NULL OR link_id IS NOT NULL
GROUP BY ALL ORDER BY busy_ms DESC
"""
PHASES_SQL = """
SELECT p.name AS phase, round(avg(p.duration_ns) / 1e6, 2) AS mean_ms, count(*) AS n
FROM spans p JOIN spans r ON p.parent_span_id = r.span_id
WHERE r.parent_span_id IS NULL GROUP BY ALL ORDER BY mean_ms DESC
"""


def check_length(seconds: float | None, steps: int | None) -> None:
    """Raises ConfigError for a run that would show nothing (no time, no steps)."""
    from chiptrace.errors import ConfigError

    if steps is not None and steps < 1:
        raise ConfigError(f"--steps {steps}: expected a whole number of steps >= 1")
    if steps is None and not (seconds is not None and seconds > 0):
        raise ConfigError(f"--seconds {seconds:g}: expected emulated seconds > 0, e.g. --seconds 5")


def run(args: argparse.Namespace) -> int:
    from chiptrace.cli.emulate import check_out
    from chiptrace.cli.query import format_table
    from chiptrace.query import connect

    check_length(args.seconds, args.steps)
    check_out(args.out, append=False)
    out = Path(args.out or f"chiptrace-traces/demo-{time.strftime('%Y%m%d-%H%M%S')}")
    if not args.no_ui and sys.stdout.isatty():
        return _run_live(args, out)
    print(
        f"chiptrace demo: {args.workload} on the emulated {args.topology}, "
        f"{args.steps or args.seconds} {'steps' if args.steps else 's'} paced to wall time ...",
        flush=True,
    )
    result = run_demo(
        out,
        args.seconds,
        steps=args.steps,
        topology=args.topology,
        workload=args.workload,
        faults=args.fault,
        speed=args.speed,
        seed=args.seed,
    )
    con = connect(out)
    print(
        f"{result.steps} steps, {result.spans:,} spans, {result.virtual_ns / 1e9:.2f} s emulated -> {out}\n"
    )
    print(format_table(con.sql(SUMMARY_SQL).to_arrow_table()))
    print()
    print(format_table(con.sql(PHASES_SQL).to_arrow_table()))
    print(f'next: chiptrace query {out} "SELECT * FROM chips"  ·  chiptrace emulate --help')
    return 0


def _run_live(args: argparse.Namespace, out: Path) -> int:
    """The emulation in a thread, shown live in the viewer (chiptrace.viewer) as it runs."""
    from chiptrace.viewer.launch import live_app

    def target(feed: Any) -> Any:
        return run_demo(
            out,
            args.seconds,
            [feed],
            steps=args.steps,
            topology=args.topology,
            workload=args.workload,
            faults=args.fault,
            speed=args.speed,
            seed=args.seed,
        )

    app, live = live_app(out, target, f"demo: {args.workload} on {args.topology}")
    live.start()
    app.run()
    if live.error is not None:
        raise live.error
    if live.result is None:
        print(f"chiptrace demo: viewer closed before the run ended; spans so far are in {out}")
    else:
        r = live.result
        print(
            f"chiptrace demo: {r.steps} steps, {r.spans:,} spans, {r.virtual_ns / 1e9:.2f} s emulated -> {out}"
        )
    print(f"next: chiptrace view {out}  ·  chiptrace report {out}")
    return 0
