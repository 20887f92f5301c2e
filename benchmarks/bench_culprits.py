"""Does `chiptrace report` name the injected fault first, and is its saving right? A random
fault matrix (tests/analysis/fault_cases.py): rack6, pcie8 and nvl72; training and mixed
for 2 steps, inference steady and overloaded; slow devices and host chips, degraded and
downed links, stragglers; random targets, values and seeds. The oracle is the emulator
re-run without the fault (same seed): "the step" is the training step's median (mixed too)
and the mean request latency for inference.

chiptrace: the rank of the first finding whose culprit (or one of its parts) is the
target, and that finding's saving against the measured one. peer: what a utilization
dashboard points at, the busiest chip or link (a slow chip is busier; a slow link busy
longer). Healthy runs: high findings on rack6, non-info findings anywhere.

The rank is the finding's place in the report's own order (faults, then bottlenecks,
then opportunities, info last: model.sort_findings), as a user reads it. Each inherent
bottleneck a healthy steady run names (a chip, a chip type or links that had to be made
twice as fast, a serving pool's capacity) is emulated that way (same seed) and its saving
checked within 25%. Cases run in `--jobs` processes, each from its own seed drawn from the
run's, so a run's cases do not depend on how many processes ran them.

    python3 benchmarks/bench_culprits.py                 # 60 cases, seeded from the clock
    python3 benchmarks/bench_culprits.py --seed 7 --quick  # 14 cases
"""

from __future__ import annotations

import argparse
import multiprocessing
import random
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests" / "analysis"))
sys.path.insert(0, str(HERE))

import fault_cases as fc  # noqa: E402
from _results import Figure, save  # noqa: E402

from chiptrace.analysis import TraceAnalysis  # noqa: E402
from chiptrace.errors import ChiptraceError  # noqa: E402

# nvl72 runs hold ~3.7M spans (2 steps): a few of them, not a third of the matrix.
TOPOLOGY_WEIGHTS = {"rack6": 5, "pcie8": 4, "nvl72": 1}


def _peer(ta: TraceAnalysis) -> str:
    t = ta.tables
    best_chip = max(t.chips.to_pylist(), key=lambda r: r["busy_ns"], default=None)
    best_link = max(t.links.to_pylist(), key=lambda r: r["busy_ns"], default=None)
    if best_link and (not best_chip or best_link["busy_ns"] > best_chip["busy_ns"]):
        return str(best_link["link_id"])
    return str(best_chip["chip_id"]) if best_chip else "-"


def _draw_kind(rng: random.Random, only: tuple[str, ...] = ()) -> tuple[str, str, str]:
    topo = rng.choices(list(TOPOLOGY_WEIGHTS), weights=list(TOPOLOGY_WEIGHTS.values()))[0]
    workloads = [w for w in fc.WORKLOADS if w != "mixed" or topo == "rack6"]  # NPUs serve
    workloads = [w for w in workloads if w in only] or workloads if only else workloads
    return topo, rng.choice(workloads), rng.choice(fc.KINDS)


def run_case(case_seed: int, root: Path, only: tuple[str, ...] = ()) -> fc.Outcome:
    """One random case from its own seed, in its own folder under `root` (`only`: these
    workloads, where the topology runs them)."""
    rng = random.Random(case_seed)
    root = root / f"case-{case_seed}"
    topo, wl, kind = _draw_kind(rng, only)
    base = fc.Case(topo, wl, "healthy", rng.randrange(1, 10_000))
    hta = TraceAnalysis(fc.emulate_case(base, root / "base"))
    case = fc.draw(rng, topo, wl, kind, fc.used_links(hta))
    case = fc.Case(case.topology, case.workload, case.kind, base.seed, case.fault, case.target)
    o = fc.Outcome(case, healthy_step=fc.the_step(hta, case.serving))
    if kind == "healthy":
        o.step, o.findings = o.healthy_step, hta.findings()
        if wl != "infer-overloaded":  # graded on steady runs only
            o.checked = _check_inherent(base, o, root)
        return o
    try:
        fc.emulate_case(case, root / case.id)
    except ChiptraceError as e:
        o.error = str(e)
        return o
    ta = TraceAnalysis(root / case.id)
    o.step, o.findings, o.peer = fc.the_step(ta, case.serving), ta.findings(), _peer(ta)
    o.rank, f = fc.rank_of(o.findings, case.target)
    o.claimed = f.saving_ns if f is not None else None
    return o


def _what_if(f: Any, topology: str) -> tuple[tuple[str, ...], tuple[str, ...]] | None:
    """The emulation of a bottleneck finding's fix: (chips twice as fast, links at twice
    their bandwidth); None where the fix is not one the emulator makes."""
    from chiptrace.emulator.topology_files import load_topology

    topo = load_topology(topology)
    how = str(f.evidence.get("what_if", ""))
    parts = tuple(f.parts) or (f.culprit,)
    if all(topo.link(p) is not None for p in parts):
        return (), parts
    if "every chip of its type" in how:
        ctype = topo.chips[f.culprit].type if f.culprit in topo.chips else f.culprit
        return tuple(topo.of_type(ctype)), ()
    if "twice as fast" in how and all(p in topo.chips for p in parts):
        return parts, ()
    return None


def _check_inherent(base: fc.Case, o: fc.Outcome, root: Path) -> list[tuple[str, float, float]]:
    """Each inherent bottleneck a healthy run names (a non-info `bottleneck` finding: a
    chip, a chip type, links or a serving pool made twice as fast) against emulating that
    change (same seed): [(rule:culprit, claimed, emulated ns)]."""
    out = []
    for k, f in enumerate(o.findings):
        if f.severity == "info" or f.kind != "bottleneck":
            continue
        fix = _what_if(f, base.topology)
        if fix is None:
            continue
        chips, links = fix
        try:
            run_dir = fc.emulate_case(
                base, root / f"fast-{k}", faster_links=links, faster_chips=chips
            )
        except ChiptraceError:
            continue
        emulated = o.healthy_step - fc.the_step(TraceAnalysis(run_dir), base.serving)
        out.append((f"{f.rule}:{f.culprit}", f.saving_ns, emulated))
    return out


def _summary(outs: list[fc.Outcome]) -> dict[str, float]:
    moving = [o for o in outs if o.case.kind != "healthy" and not o.error and o.moved >= fc.MOVES]
    n = max(len(moving), 1)
    healthy = [
        o for o in outs if o.case.kind == "healthy" and o.case.workload != "infer-overloaded"
    ]
    rack6 = [o for o in healthy if o.case.topology == "rack6"]
    return {
        "moving": len(moving),
        "top1": sum(o.rank == 1 for o in moving) / n,
        "top3": sum(o.rank is not None and o.rank <= 3 for o in moving) / n,
        "saving": sum(o.saving_ok for o in moving) / n,
        "peer_top1": sum(o.peer == o.case.target for o in moving) / n,
        "healthy": len(healthy),
        "rack6_high": sum(any(f.severity == "high" for f in o.findings) for o in rack6),
        "rack6": len(rack6),
        "over5": sum(sum(f.severity != "info" for f in o.findings) > 5 for o in healthy),
        "inherent": len(checked := [c for o in healthy for c in o.checked]),
        "inherent_ok": sum(abs(a - b) <= 0.25 * abs(b) for _, a, b in checked),
    }


def _print_case(o: fc.Outcome) -> None:
    c = o.case
    if o.error:
        print(f"  {c.id:38s} {c.fault}: error: {o.error[:70]}")
        return
    for what, claimed, emulated in o.checked:
        ok = "ok" if abs(claimed - emulated) <= 0.25 * abs(emulated) else "OFF"
        print(
            f"  {c.id:38s} inherent {what}: claimed {claimed / 1e6:.2f} ms, emulated twice "
            f"as fast {emulated / 1e6:.2f} ms {ok}"
        )
    top = o.findings[0] if o.findings else None
    head = f"{top.rule}:{top.culprit} {top.saving_ns / 1e6:.2f} ms" if top else "-"
    claimed = "-" if o.claimed is None else f"{o.claimed / 1e6:.2f}"
    print(
        f"  {c.id:38s} {c.fault or '':44s} moved {o.moved:+7.1%} actual {o.actual / 1e6:8.2f} ms"
        f" claimed {claimed:>8s} rank {o.rank or '-'}  top {head}"
    )


def _cells(outs: list[fc.Outcome]) -> list[str]:
    """Per topology x fault kind (faults moving the step >= 2%): cases, top 1, top 3,
    saving within 25%."""
    cells: dict[tuple[str, str], list[fc.Outcome]] = defaultdict(list)
    for o in outs:
        if o.case.kind != "healthy" and not o.error and o.moved >= fc.MOVES:
            cells[(o.case.topology, o.case.kind)].append(o)
    lines = [
        f"  {'topology':8s} {'fault':12s} {'cases':>5s} {'top1':>6s} {'top3':>6s} {'saving':>6s}"
    ]
    for (topo, kind), os_ in sorted(cells.items()):
        k = len(os_)
        top1 = sum(o.rank == 1 for o in os_)
        top3 = sum(o.rank is not None and o.rank <= 3 for o in os_)
        ok = sum(o.saving_ok for o in os_)
        lines.append(f"  {topo:8s} {kind:12s} {k:5d} {top1:6d} {top3:6d} {ok:6d}")
    return lines


def _outcomes(
    seeds: list[int], root: Path, jobs: int, only: tuple[str, ...]
) -> Iterator[fc.Outcome]:
    """The cases' outcomes in order, run in `jobs` processes (spawned: no DuckDB state is
    shared)."""
    if jobs <= 1:
        yield from (run_case(s, root, only) for s in seeds)
        return
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(jobs, mp_context=ctx) as pool:
        yield from pool.map(run_case, seeds, [root] * len(seeds), [only] * len(seeds))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seed", type=int, default=None, help="default: from the clock")
    ap.add_argument("--cases", type=int, default=60)
    ap.add_argument("--quick", action="store_true", help="14 cases")
    # One process by default: on a shared 2-core machine 2 jobs ran 45 cases a minute
    # against 62 for one (30 cases, seed 32: each spawned worker imports and competes).
    ap.add_argument("--jobs", type=int, default=1, help="processes running cases (default 1)")
    ap.add_argument(
        "--workloads",
        default="",
        help=f"comma-separated, of {','.join(fc.WORKLOADS)} (default: all; not saved)",
    )
    args = ap.parse_args()
    only = tuple(w for w in args.workloads.split(",") if w)
    if set(only) - set(fc.WORKLOADS):
        ap.error(f"--workloads {args.workloads}: expected some of {','.join(fc.WORKLOADS)}")
    seed = args.seed if args.seed is not None else int(time.time())
    n = 14 if args.quick else args.cases
    rng = random.Random(seed)
    seeds = [rng.randrange(1, 2**31) for _ in range(n)]
    t0 = time.perf_counter()
    outs = []
    with tempfile.TemporaryDirectory(prefix="chiptrace-culprits-") as tmp:
        for o in _outcomes(seeds, Path(tmp), args.jobs, only):
            _print_case(o)
            outs.append(o)
    wall = time.perf_counter() - t0
    print("faults moving the step >= 2%, per cell (cases; culprit top 1, top 3; saving ok):")
    print("\n".join(_cells(outs)))
    s = _summary(outs)
    print(f"seed {seed}, {n} cases, {s['moving']} faults moving the step >= 2%:")
    figures = [
        Figure(
            "culprit is the top finding",
            "%",
            100 * s["top1"],
            100 * s["peer_top1"],
            "busiest part",
            ">= 90",
            better="higher",
        ),
        Figure("culprit in the top 3", "%", 100 * s["top3"], None, "", ">= 98", better="higher"),
        Figure(
            "saving within 25% of the re-run",
            "%",
            100 * s["saving"],
            None,
            "",
            ">= 90",
            better="higher",
        ),
        Figure("healthy rack6 runs with a high finding", "", s["rack6_high"], None, "", "<= 0"),
        Figure("healthy runs with > 5 non-info findings", "", s["over5"], None, "", "<= 0"),
    ]
    if s["inherent"]:
        figures.append(
            Figure(
                "inherent bottlenecks an emulation confirms",
                "%",
                100 * s["inherent_ok"] / s["inherent"],
                None,
                "",
                ">= 90",
                better="higher",
            )
        )
    for f in figures:
        print(f.line())
    print(
        f"healthy steady runs: {s['healthy']} ({s['rack6']} on rack6), inherent "
        f"bottlenecks checked by emulation: {s['inherent_ok']}/{s['inherent']}; "
        f"{wall:.0f} s in all, {60 * n / wall:.0f} cases a minute ({args.jobs} jobs)"
    )
    if not args.quick and not only:
        save("culprits", figures, mode=f"seed {seed}, {n} cases")


if __name__ == "__main__":
    main()
