"""A random fault matrix on the emulated rack, and its oracle: the same run without the fault.

Shared by benchmarks/bench_culprits.py (many cases, seeded from the clock) and
tests/analysis/test_fault_matrix.py (a small fixed slice). A case is a topology (rack6,
pcie8, nvl72), a workload (training and mixed for 2 steps; inference steady and
overloaded), a fault with a random target (never a fixed first chip or link) and value, and
an emulator seed. "The step" is the training step's median (mixed too) and, for inference,
the mean request latency; the oracle is the faulty run's step less the fault-free run's.
"""

from __future__ import annotations

import random
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

TOPOLOGIES = ("rack6", "pcie8", "nvl72")
WORKLOADS = ("train", "mixed", "infer-steady", "infer-overloaded")
KINDS = ("slow-device", "slow-host", "degrade", "down", "straggler", "healthy")
TRAIN_STEPS = 2
BATCHES = 80
# Requests per second the inference devices sustain (steady: under a third of what they
# serve in full batches) and at least twice what they can serve (overloaded: the queue grows
# over the run), at 8 layers and ops at their roofline. What they serve, static schedule
# (chiptrace.emulator.infer.serving_capacity): rack6 1,815/s, pcie8 351/s, nvl72 46,639/s.
RATES = {
    "rack6": (400, 4000),
    "pcie8": (100, 1500),
    "nvl72": (2000, 95000),
}
MOVES = 0.02  # a fault that moves the step by less than this is not graded for culprits


@dataclass(frozen=True)
class Case:
    """One emulated run, its fault, and the target the report must name."""

    topology: str
    workload: str
    kind: str
    seed: int
    fault: str | None = None
    target: str = ""

    @property
    def id(self) -> str:
        return f"{self.topology}-{self.workload}-{self.kind}-s{self.seed}"

    @property
    def serving(self) -> bool:
        return self.workload.startswith("infer")

    def emulate_args(self) -> dict[str, Any]:
        wl = "infer" if self.serving else self.workload
        opts: dict[str, Any] = {}
        if self.serving:
            rate = RATES[self.topology][self.workload == "infer-overloaded"]
            opts = {"rate": rate, "layers": 8, "efficiency": "ideal"}
        steps = BATCHES if self.serving else TRAIN_STEPS
        return {"topology": self.topology, "workload": wl, "steps": steps, "options": opts}


def _devices(topo: Any, workload: str) -> list[str]:
    types = ("gpu", "npu") if workload != "train" else ("gpu",)
    return [c for c in topo.chips if topo.chips[c].type in types]


def draw(rng: random.Random, topology: str, workload: str, kind: str, links: list[str]) -> Case:
    """A case with a random target and value (`links`: the links the fault-free run uses)."""
    from chiptrace.emulator.topology_files import load_topology

    topo = load_topology(topology)
    seed = rng.randrange(1, 10_000)
    if kind == "healthy":
        return Case(topology, workload, kind, seed)
    if kind == "slow-device":
        target = rng.choice(_devices(topo, workload))
        return Case(
            topology, workload, kind, seed, f"slow:{target}:{rng.uniform(1.5, 4):.2f}", target
        )
    if kind == "slow-host":
        hosts = [c for c in topo.chips if topo.chips[c].type in ("cpu", "dpu")]
        target = rng.choice(hosts)
        return Case(
            topology, workload, kind, seed, f"slow:{target}:{rng.uniform(1.5, 4):.2f}", target
        )
    if kind == "straggler":
        target = rng.choice(_devices(topo, workload))
        ms = rng.uniform(1, 10) if workload.startswith("infer") else rng.uniform(2, 30)
        return Case(topology, workload, kind, seed, f"straggler:{target}:{ms:.2f}", target)
    target = rng.choice(links or [lk.id for lk in topo.links])
    if kind == "degrade":
        return Case(
            topology, workload, kind, seed, f"degrade:{target}:{rng.uniform(0.05, 0.3):.3f}", target
        )
    return Case(topology, workload, kind, seed, f"down:{target}", target)


def emulate_case(
    case: Case,
    out: Path,
    fault: bool = True,
    faster_links: tuple[str, ...] = (),
    faster_chips: tuple[str, ...] = (),
) -> Path:
    """Run the case (or, fault=False, the same seed without its fault) into `out`;
    `faster_links` / `faster_chips`: links at twice their bandwidth, chips twice as fast
    (a what-if emulation of an inherent bottleneck)."""
    from chiptrace.emulator import emulate

    args = case.emulate_args()
    if faster_links:
        args["topology"] = faster(args["topology"], faster_links)
    faults = [case.fault] if fault and case.fault else []
    emulate(
        **args,
        seed=case.seed,
        out=out,
        faults=faults + [f"slow:{c}:0.5" for c in faster_chips],
        progress=False,
    )
    return out


def faster(topology: str, links: tuple[str, ...], factor: float = 2.0) -> Any:
    """The preset `topology` with `links` (ids, or link types) at `factor` x their bandwidth."""
    import dataclasses

    from chiptrace.emulator.topology_files import load_topology
    from chiptrace.topology import Topology

    topo = load_topology(topology)
    chosen = set(links)
    new = [
        dataclasses.replace(lk, bandwidth=lk.bandwidth * factor)
        if lk.id in chosen or lk.type in chosen
        else lk
        for lk in topo.links
    ]
    return Topology(dict(topo.chips), new, topo.name, topo.source, topo.description)


def the_step(ta: Any, serving: bool) -> float:
    """The step (ns): the training step's median, or the mean request latency."""
    for w in ta.tables.workloads:
        if serving != (w.name == "request"):
            continue
        starts = w.steps.column("start_ns").to_pylist()
        ends = w.steps.column("end_ns").to_pylist()
        durs = [e - s for s, e in zip(starts, ends, strict=True)]
        if durs:
            return float(statistics.fmean(durs) if serving else statistics.median(durs))
    return 0.0


def used_links(ta: Any) -> list[str]:
    """Links that carried bytes in a run."""
    rows = ta.tables.links.to_pylist()
    return sorted({r["link_id"] for r in rows if (r["bytes"] or 0) > 0})


def rank_of(findings: list[Any], target: str) -> tuple[int | None, Any]:
    """1-based rank of the first finding naming `target` (culprit or one of its parts)."""
    for k, f in enumerate(findings, 1):
        if f.culprit == target or target in f.parts:
            return k, f
    return None, None


@dataclass
class Outcome:
    """What one case gave: the measured and claimed figures."""

    case: Case
    error: str | None = None
    healthy_step: float = 0.0
    step: float = 0.0
    rank: int | None = None
    claimed: float | None = None
    findings: list[Any] = field(default_factory=list)
    peer: str = ""
    # inherent bottlenecks checked by emulation: (rule:culprit, claimed, emulated ns)
    checked: list[tuple[str, float, float]] = field(default_factory=list)

    @property
    def moved(self) -> float:
        return (self.step - self.healthy_step) / self.healthy_step if self.healthy_step else 0.0

    @property
    def actual(self) -> float:
        return self.step - self.healthy_step

    @property
    def saving_ok(self) -> bool:
        return self.claimed is not None and abs(self.claimed - self.actual) <= 0.25 * abs(
            self.actual
        )


def fixed_slice(seed: int = 23) -> list[tuple[str, str, str]]:
    """(topology, workload, kind) of the test's slice: every kind once on rack6, on the
    workloads in turn; the targets and values are drawn from `seed` when the case runs."""
    workloads = ("train", "mixed", "infer-steady")
    return [("rack6", workloads[k % 3], kind) for k, kind in enumerate(KINDS)]


def run(topology: str, workload: str, kind: str, seed: int, root: Path) -> Outcome:
    """Emulate the fault-free run and the faulty one, analyse, and grade (one case)."""
    from chiptrace.analysis import TraceAnalysis
    from chiptrace.errors import ChiptraceError

    rng = random.Random(f"{seed}:{topology}:{workload}:{kind}")
    base = Case(topology, workload, "healthy", rng.randrange(1, 10_000))
    hta = TraceAnalysis(emulate_case(base, root / f"{base.id}-base"))
    drawn = draw(rng, topology, workload, kind, used_links(hta))
    case = Case(topology, workload, kind, base.seed, drawn.fault, drawn.target)
    o = Outcome(case, healthy_step=the_step(hta, case.serving))
    if kind == "healthy":
        o.step, o.findings = o.healthy_step, hta.findings()
        return o
    try:
        ta = TraceAnalysis(emulate_case(case, root / case.id))
    except ChiptraceError as e:
        o.error = str(e)
        return o
    o.step, o.findings = the_step(ta, case.serving), ta.findings()
    o.rank, f = rank_of(o.findings, case.target)
    o.claimed = f.saving_ns if f is not None else None
    return o
