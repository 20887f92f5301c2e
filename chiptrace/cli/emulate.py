"""`chiptrace emulate`: run a workload on the emulated rack and write its spans."""

from __future__ import annotations

import argparse
import logging
import secrets
from collections.abc import Callable
from pathlib import Path

from chiptrace.errors import ConfigError, StoreError

NAME = "emulate"
ORDER = 5
HELP = "run a workload on an emulated rack (six chip types, links, faults) into a trace dir"
DESCRIPTION = (
    "Run a training, inference or mixed workload on a discrete-event model of a rack and write one "
    "span per chip op and per link transfer. Example: chiptrace emulate --topology rack6 "
    "--workload train --steps 20 --seed 1 --out DIR --fault slow:gpu:3:4. With --calibrate "
    "IMPORTED_DIR, replay a real job's profiler steps on --topology instead."
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--topology",
        default="rack6",
        help="preset (rack6, nvl72, pcie8, a100x8, h100x8) or a TOML path",
    )
    p.add_argument(
        "--workload", default="train", help="train, infer or mixed (train on GPUs + serve on NPUs)"
    )
    p.add_argument("--steps", type=int, default=20, help="training steps or inference batches")
    p.add_argument("--seed", type=int, default=0, help="same seed, same spans (ids included)")
    p.add_argument(
        "--out", metavar="DIR", help="trace dir (default: ./chiptrace-traces/emulate-<time>)"
    )
    p.add_argument(
        "--append",
        action="store_true",
        help="add this run to an --out that already holds a trace (its spans get new ids)",
    )
    p.add_argument(
        "--fault",
        action="append",
        default=[],
        metavar="KIND:TARGET[:VALUE]",
        help="slow:gpu:3:4, degrade:LINK_ID:0.1, down:LINK_ID, straggler:CHIP:0.5 (ms); repeatable",
    )
    p.add_argument(
        "--precision",
        help="fp32, bf16, fp16, fp8, nvfp4, int8 (default bf16; with --calibrate, the trace's)",
    )
    p.add_argument(
        "--calibrate",
        metavar="IMPORTED_DIR",
        help="replay the profiler steps of an imported real trace (chiptrace import) on "
        "--topology: workload replay, efficiencies fitted from the trace",
    )
    p.add_argument("--schedule", default="static", help="static or dynamic placement")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        dest="options",
        help="workload knob, e.g. bucket_mb=8, overlap=false, optimizer=cpu; repeatable",
    )
    p.add_argument("--realtime", action="store_true", help="pace the run to wall time")
    p.add_argument("--speed", type=float, default=1.0, help="with --realtime: virtual s per wall s")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument(
        "--scenario", help="start from a named scenario (see --list); flags given add to it"
    )
    p.add_argument(
        "--list",
        action="store_true",
        help="list the preset topologies and named scenarios, then exit",
    )


def parse_options(items: list[str]) -> dict[str, str]:
    """`KEY=VALUE` strings to a dict; raises ConfigError naming a malformed item."""
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--set {item!r}: expected KEY=VALUE, for example bucket_mb=8")
        out[key.strip()] = value.strip()
    return out


def list_presets() -> str:
    """Presets with their chip counts, and the named scenarios, as text."""
    from collections import Counter

    from chiptrace.emulator import PRESETS, SCENARIOS, load_topology

    lines = ["topologies (--topology NAME, or a TOML path):"]
    for name in PRESETS:
        topo = load_topology(name)
        counts = Counter(c.type for c in topo.chips.values())
        chips = ", ".join(f"{n} {t}" for t, n in counts.items())
        lines.append(f"  {name:<8} {chips}; {len(topo.links)} links. {topo.description}")
    lines.append("scenarios (chiptrace.emulator.SCENARIOS; emulate(**SCENARIOS[name])):")
    for name, kwargs in SCENARIOS.items():
        lines.append(f"  {name:<24} {kwargs or '(defaults)'}")
    return "\n".join(lines)


_DEFAULTS = {"topology": "rack6", "workload": "train", "precision": "bf16", "schedule": "static"}


def with_scenario(name: str, kwargs: dict) -> dict:
    """Merge a named scenario under the flags: its faults and knobs are added to the given
    ones, its topology/workload/precision/schedule apply where the flag kept its default."""
    from chiptrace.emulator import SCENARIOS

    if name not in SCENARIOS:
        raise ConfigError(f"--scenario {name!r}: unknown; expected one of {', '.join(SCENARIOS)}")
    sc = SCENARIOS[name]
    out = dict(kwargs)
    out["faults"] = [*sc.get("faults", []), *kwargs["faults"]]
    out["options"] = {**sc.get("options", {}), **kwargs["options"]}
    for key, default in _DEFAULTS.items():
        if key in sc and kwargs[key] == default:
            out[key] = sc[key]
    return out


def check_out(out: str | None, append: bool) -> None:
    """Refuse to mix a run into a trace dir that holds something, unless asked to.

    Raises:
        ConfigError: `out` is a file, or a non-empty directory without --append.
    """
    if not out:
        return
    path = Path(out)
    if path.exists() and not path.is_dir():
        raise ConfigError(f"--out {out}: is a file; expected a trace directory")
    if not append and path.is_dir() and any(path.iterdir()):
        raise ConfigError(
            f"--out {out}: is not empty; pass --append to add this run to it "
            "(with new span ids), or choose another directory"
        )


def _quiet_store_warnings() -> Callable[[], None]:
    """The store's failures end in the one summary line run() prints: hold the recorder's
    per-sink warnings back meanwhile. Returns the function that restores the level."""
    logger = logging.getLogger("chiptrace")
    level = logger.level
    logger.setLevel(logging.ERROR)
    return lambda: logger.setLevel(level)


def run(args: argparse.Namespace) -> int:
    from chiptrace.emulator import emulate

    if args.list:
        print(list_presets())
        return 0
    check_out(args.out, args.append)

    options = parse_options(args.options)
    workload = args.workload
    if args.calibrate:
        if workload not in ("train", "replay"):
            raise ConfigError(f"--calibrate replays a trace: --workload {workload} does not apply")
        workload = "replay"
        options = {"calibrate": args.calibrate, **options}
        if args.precision:
            options.setdefault("precision", args.precision)
    kwargs = {
        "topology": args.topology,
        "workload": workload,
        "steps": args.steps,
        "seed": args.seed,
        "out": args.out,
        "faults": args.fault,
        "precision": args.precision or "bf16",
        "schedule": args.schedule,
        "realtime": args.realtime,
        "speed": args.speed,
        "options": options,
        "progress": False if args.no_progress else None,
    }
    if args.scenario:
        kwargs = with_scenario(args.scenario, kwargs)
    if args.append:  # the seed still fixes the timeline; the ids must not repeat the dir's
        kwargs["id_seed"] = secrets.randbits(63)
    restore = _quiet_store_warnings()
    try:
        result = emulate(**kwargs)
    finally:
        restore()
    if result.dropped or result.error:
        why = f": {result.error}" if result.error else ""
        raise StoreError(
            f"stored {result.stored:,} of {result.spans:,} spans in {result.out}, "
            f"{result.dropped:,} dropped{why}"
        )
    print(
        f"chiptrace emulate: {result.steps} {kwargs['workload']} steps on {kwargs['topology']}, "
        f"{result.stored:,} spans stored, {result.virtual_ns / 1e6:.1f} ms emulated in "
        f"{result.wall_s:.2f} s -> {result.out}"
    )
    for link, chips in result.lost.items():
        print(f"{link} was the only path to {', '.join(chips)}: the run went on without them")
    print(f'next: chiptrace query {result.out} "SELECT * FROM chips"')
    return 0
