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

    python3 benchmarks/bench_culprits.py                 # 60 cases, seeded from the clock
    python3 benchmarks/bench_culprits.py --seed 7 --quick  # 14 cases
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

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


def _draw_kind(rng: random.Random) -> tuple[str, str, str]:
    topo = rng.choices(list(TOPOLOGY_WEIGHTS), weights=list(TOPOLOGY_WEIGHTS.values()))[0]
    workloads = [w for w in fc.WORKLOADS if w != "mixed" or topo == "rack6"]  # NPUs serve
    return topo, rng.choice(workloads), rng.choice(fc.KINDS)


def run_case(rng: random.Random, root: Path, healthy: dict) -> fc.Outcome:
    topo, wl, kind = _draw_kind(rng)
    base = fc.Case(topo, wl, "healthy", rng.randrange(1, 10_000))
    out = root / f"base-{len(healthy)}"
    fc.emulate_case(base, out)
    hta = TraceAnalysis(out)
    case = fc.draw(rng, topo, wl, kind, fc.used_links(hta))
    case = fc.Case(case.topology, case.workload, case.kind, base.seed, case.fault, case.target)
    o = fc.Outcome(case, healthy_step=fc.the_step(hta, case.serving))
    healthy[case.id] = o.healthy_step
    if kind == "healthy":
        o.step, o.findings = o.healthy_step, hta.findings()
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


def _check_inherent(base: fc.Case, o: fc.Outcome, root: Path) -> list[tuple[float, float]]:
    """Each inherent chip bottleneck a healthy run names (a finding priced with the chip
    twice as fast) against emulating it twice as fast (`slow:CHIP:0.5`, same seed):
    [(claimed, emulated) ns]."""
    out = []
    for f in o.findings:
        how = str(f.evidence.get("what_if", ""))
        if f.severity == "info" or "twice as fast" not in how or "link" in how or f.parts:
            continue
        fast = fc.Case(base.topology, base.workload, "fast", base.seed, f"slow:{f.culprit}:0.5")
        try:
            run = TraceAnalysis(fc.emulate_case(fast, root / f"{fast.id}-{f.culprit}"))
        except ChiptraceError:
            continue
        out.append((f.saving_ns, o.healthy_step - fc.the_step(run, base.serving)))
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
        "inherent_ok": sum(abs(a - b) <= 0.25 * abs(b) for a, b in checked),
    }


def _print_case(o: fc.Outcome) -> None:
    c = o.case
    if o.error:
        print(f"  {c.id:38s} {c.fault}: error: {o.error[:70]}")
        return
    top = o.findings[0] if o.findings else None
    head = f"{top.rule}:{top.culprit} {top.saving_ns / 1e6:.2f} ms" if top else "-"
    claimed = "-" if o.claimed is None else f"{o.claimed / 1e6:.2f}"
    print(
        f"  {c.id:38s} {c.fault or '':44s} moved {o.moved:+7.1%} actual {o.actual / 1e6:8.2f} ms"
        f" claimed {claimed:>8s} rank {o.rank or '-'}  top {head}"
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seed", type=int, default=None, help="default: from the clock")
    ap.add_argument("--cases", type=int, default=60)
    ap.add_argument("--quick", action="store_true", help="14 cases")
    args = ap.parse_args()
    seed = args.seed if args.seed is not None else int(time.time())
    n = 14 if args.quick else args.cases
    rng = random.Random(seed)
    t0 = time.perf_counter()
    outs = []
    by_cell: dict[tuple[str, str], list[fc.Outcome]] = defaultdict(list)
    with tempfile.TemporaryDirectory(prefix="chiptrace-culprits-") as tmp:
        healthy: dict[str, float] = {}
        for _ in range(n):
            o = run_case(rng, Path(tmp), healthy)
            _print_case(o)
            outs.append(o)
            by_cell[(o.case.topology, o.case.kind)].append(o)
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
                "inherent chip bottlenecks an emulation confirms",
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
        f"healthy steady runs: {s['healthy']} ({s['rack6']} on rack6), inherent chip "
        f"bottlenecks checked by emulation: {s['inherent_ok']}/{s['inherent']}; "
        f"{time.perf_counter() - t0:.0f} s in all"
    )
    if not args.quick:
        save("culprits", figures, mode=f"seed {seed}, {n} cases")


if __name__ == "__main__":
    main()
