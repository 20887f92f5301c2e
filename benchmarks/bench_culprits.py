"""Does `chiptrace report` name the injected fault? Recall and false alarms over the fault
matrix (tests/analysis/fault_cases.py): slow chip, straggler, degraded link and downed link
on training, inference and mixed workloads of the emulated rack6 (and pcie8), several seeds.

chiptrace: the report's top finding (for pcie8's straggler, the top finding the healthy run
lacks) names the injected target; a false alarm is a finding above low in a healthy run.
peer: what a utilization dashboard points at, the busiest chip or the busiest link (a slow
chip is busier; a slow link is busy longer); it never stays quiet, so every healthy run is
one false alarm for it.

    python3 benchmarks/bench_culprits.py            # seeds 1-5 on rack6, 1-2 on pcie8
    python3 benchmarks/bench_culprits.py --quick    # seeds 1-2, 1
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests" / "analysis"))

import fault_cases  # noqa: E402

from chiptrace.analysis import TraceAnalysis  # noqa: E402
from chiptrace.errors import ChiptraceError  # noqa: E402


def _peer(ta: TraceAnalysis) -> str:
    t = ta.tables
    chips = t.chips.to_pylist()
    links = t.links.to_pylist()
    best_chip = max(chips, key=lambda r: r["busy_ns"], default=None)
    best_link = max(links, key=lambda r: r["busy_ns"], default=None)
    if best_link and (not best_chip or best_link["busy_ns"] > best_chip["busy_ns"]):
        return best_link["link_id"]
    return best_chip["chip_id"] if best_chip else "-"


def _top(ta: TraceAnalysis, case: fault_cases.Case, healthy: dict) -> str:
    found = [f for f in ta.findings() if f.severity != "info"]
    if (case.topology, case.workload, case.kind) in fault_cases.NEW_ONLY:
        base = healthy.get((case.topology, case.workload, case.seed), set())
        found = [f for f in found if (f.rule, f.culprit) not in base]
    return found[0].culprit if found else "-"


def run_case(case: fault_cases.Case, root: Path, healthy: dict) -> dict:
    out = root / case.id
    t0 = time.perf_counter()
    try:
        fault_cases.emulate_case(case, out)
    except ChiptraceError as e:
        return {"case": case, "error": str(e), "s": time.perf_counter() - t0}
    ta = TraceAnalysis(out)
    findings = ta.findings()
    row = {"case": case, "s": 0.0, "peer": _peer(ta)}
    if case.kind == "healthy":
        row["alarms"] = [f for f in findings if f.severity in ("high", "medium")]
    else:
        row["top"] = _top(ta, case, healthy)
    row["s"] = time.perf_counter() - t0
    return row


def _healthy_findings(case: fault_cases.Case, root: Path) -> set:
    out = root / f"base-{case.id}"
    fault_cases.emulate_case(case, out, fault=False)
    return {(f.rule, f.culprit) for f in TraceAnalysis(out).findings()}


def score(seeds: tuple[int, ...], pcie8_seeds: tuple[int, ...]) -> dict[tuple, dict]:
    """Run every case; per (topology, workload, fault kind) the counts the table shows."""
    table: dict[tuple, dict] = defaultdict(lambda: defaultdict(int))
    with tempfile.TemporaryDirectory(prefix="chiptrace-culprits-") as tmp:
        root = Path(tmp)
        healthy = {}
        for c in fault_cases.cases(seeds, pcie8_seeds):
            if (c.topology, c.workload, c.kind) in fault_cases.NEW_ONLY:
                healthy[(c.topology, c.workload, c.seed)] = _healthy_findings(c, root)
            r = run_case(c, root, healthy)
            cell = table[(c.topology, c.workload, c.kind)]
            cell["runs"] += 1
            if "error" in r or c.expects_error:
                cell["errors"] += int("error" in r and c.expects_error)
            elif c.kind == "healthy":
                cell["alarms"] += int(bool(r["alarms"]))
                cell["peer_alarms"] += 1
            else:
                cell["hits"] += int(r["top"] == c.target)
                cell["peer_hits"] += int(r["peer"] == c.target)
    return table


def _row(kind: str, cell: dict, tot: dict) -> tuple[str, str]:
    n = cell["runs"]
    if "errors" in cell:
        return (f"{cell['errors']}/{n} clear error",) * 2  # type: ignore[return-value]
    if kind == "healthy":
        tot["alarms"] += cell["alarms"]
        tot["peer_alarms"] += cell["peer_alarms"]
        tot["healthy"] += n
        return f"{cell['alarms']}/{n} false alarm", f"{cell['peer_alarms']}/{n} false alarm"
    tot["hits"] += cell["hits"]
    tot["peer_hits"] += cell["peer_hits"]
    tot["faults"] += n
    return f"{cell['hits']}/{n} named", f"{cell['peer_hits']}/{n} named"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="seeds 1-2 (rack6) and 1 (pcie8)")
    args = ap.parse_args()
    seeds, pseeds = ((1, 2), (1,)) if args.quick else ((1, 2, 3, 4, 5), (1, 2))
    t0 = time.perf_counter()
    table = score(seeds, pseeds)
    print(
        f"{'topology':<8} {'workload':<7} {'fault':<10} {'runs':>4}  {'chiptrace':>16}  {'peer':>16}"
    )
    tot: dict[str, int] = defaultdict(int)
    for (topo, wl, kind), cell in table.items():
        ours, peer = _row(kind, cell, tot)
        print(f"{topo:<8} {wl:<7} {kind:<10} {cell['runs']:>4}  {ours:>16}  {peer:>16}")
    r_ours = tot["hits"] / max(tot["faults"], 1)
    r_peer = tot["peer_hits"] / max(tot["faults"], 1)
    print(
        f"recall: chiptrace {r_ours:.0%} ({tot['hits']}/{tot['faults']}), peer {r_peer:.0%} "
        f"({tot['peer_hits']}/{tot['faults']}); ratio {r_ours / max(r_peer, 1e-9):.1f}x"
    )
    print(
        f"false alarms on healthy runs: chiptrace {tot['alarms']}/{tot['healthy']}, "
        f"peer {tot['peer_alarms']}/{tot['healthy']}; {time.perf_counter() - t0:.0f} s in all"
    )


if __name__ == "__main__":
    main()
