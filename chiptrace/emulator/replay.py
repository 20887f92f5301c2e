"""`workload=replay`: a real job's profiler steps (calibrate.py) replayed on another rack.

Each source rank runs on the target GPU of the same index. Ops run in their source order
per stream, one timeline through every step (a GPU that runs behind its host, finishing
step N while the host is in step N+1, keeps doing so): an op starts after the op before it
on its stream plus the gap the trace shows there (host time: launches, syncs, the data
loader: kept as measured, never stretched), and after the op of another stream that ended
just before it in the trace (the event it waited on). Op times change with the rack:

- gemm, attention: work = source time x source peak x source efficiency, at the target's
  peak and efficiency in the replay's precision (the trace's unless `precision` is set);
- elementwise, optimizer: the same with memory bandwidth (elementwise bytes scale with the
  precision's width);
- comm: collectives with their bytes whose ranks share one target host (the trace's
  process group ranks, else a group that fits one) are re-planned on its links
  (collectives.py) at the job's fitted comm efficiency; the others scale by the bandwidth
  of the links they cross (hosts.py): the GPUs' fabric when the group (the job's world
  size where the trace names none) stays on one host, the NICs' network links when it
  spans hosts;
- copy: host-device copies move their bytes over the target's route.

A step lasts as long as it did in the trace, plus how much later (or sooner) the device
work has got in it: replaying on the source machine gives the trace's own step times back
(comm as fitted on the sum).
Spans: a `ProfilerStep#N` root per step and each op under it with its kernel name, so a
replay's report can be diffed against the imported trace's.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from chiptrace.emulator import calibrate, collectives
from chiptrace.emulator.context import Context
from chiptrace.emulator.efficiency import Efficiency, check_mode
from chiptrace.emulator.errors import WorkloadError
from chiptrace.emulator.hosts import Machine
from chiptrace.emulator.network import Network
from chiptrace.emulator.op_cost import BYTES, resolve_precision
from chiptrace.emulator.train_step import transfers
from chiptrace.schema import PRECISIONS

_DEP_NS = 20_000.0  # an op this soon after another stream's op ended waited on it
_COMPUTE = ("gemm", "attention")
_KIND = {"compute": "compute", "comm": "comm", "memcpy": "memcpy", "memset": "memcpy"}


@dataclass
class ReplayConfig:
    """Knobs of the replay workload (`--calibrate DIR` sets `calibrate`)."""

    calibrate: str = ""  # the imported trace dir
    source: str = ""  # the machine it ran on (preset or TOML); default from its GPU names
    precision: str = ""  # replay precision; default the trace's
    efficiency: str = "preset"

    def check(self) -> None:
        if not self.calibrate:
            raise WorkloadError("workload replay needs calibrate = DIR (an imported trace dir)")
        check_mode(self.efficiency)
        if self.precision and self.precision not in PRECISIONS:
            raise WorkloadError(
                f"workload precision = {self.precision!r}: expected one of {', '.join(PRECISIONS)}"
            )


class Replay:
    """The calibrated job bound to a run context; `step(s)` replays source step s mod n."""

    def __init__(self, ctx: Context, cfg: ReplayConfig) -> None:
        cfg.check()
        self.ctx, self.cfg = ctx, cfg
        self.prof = calibrate.load(cfg.calibrate, cfg.source)
        self.gpus = ctx.topology.of_type("gpu")
        if len(self.prof.ranks) > len(self.gpus):
            raise WorkloadError(
                f"calibrate {cfg.calibrate}: {len(self.prof.ranks)} ranks, topology "
                f"{ctx.topology.name} has {len(self.gpus)} GPUs"
            )
        self.eff = Efficiency(cfg.efficiency)
        self.src_net = Network(self.prof.source)
        self.src_gpus = self.prof.source.of_type("gpu")
        self.chip = ctx.topology.chips[self.gpus[0]]
        self.precision = resolve_precision(self.chip, cfg.precision or self.prof.precision)
        self.scale = self._scales()
        self.comm_eff = self._fit_comm()
        self.machines = (Machine.of(self.src_net), Machine.of(ctx.network))
        cpus = ctx.topology.of_type("cpu")
        # Each GPU's nearest CPU, None without CPUs (host copies then cost nothing extra).
        self.host: dict[str, str | None] = {}
        for g in self.gpus:
            near = ctx.network.nearest(g, cpus)
            self.host[g] = near[0] if near else None
        self.plans: dict[tuple[Any, ...], collectives.Plan | None] = {}  # None: spans hosts
        self.t = 0.0  # where the next step starts (replay ns)
        self.v = 0.0  # where it started in the trace, steps laid back to back (ns)
        self.drift = 0.0  # how much later the device work ends than in the trace
        # Per rank and stream: (trace end, replay end) of its last op, across steps.
        self.chain: dict[tuple[int, int], tuple[float, float]] = {}
        self.done: dict[int, list[tuple[float, float, int]]] = {}  # rank -> recent ops
        # A new pass over the source steps: per stream, when the last pass's work ends,
        # and how much that delayed the pass's first ops (the host does not wait for it).
        self.backlog: dict[tuple[int, int], float] = {}
        self.carried = 0.0

    def _scales(self) -> dict[str, float]:
        """Target time over source time, per compute class."""
        p, src, tgt = self.prof, self.prof.gpu, self.chip
        out: dict[str, float] = {}
        for cls in ("gemm", "attention", "elementwise", "optimizer"):
            e_src = self.eff.of(src.efficiency, cls, p.precision)
            fit = p.fitted.get(cls, e_src) / e_src  # the job's kernels against the preset's
            e_tgt = self.eff.of(tgt.efficiency, cls, self.precision) * fit
            if cls in _COMPUTE:
                rate = src.peak_flops[p.precision] * e_src * fit
                out[cls] = rate / (tgt.peak_flops[self.precision] * e_tgt)
            else:
                width = BYTES[self.precision] / BYTES[p.precision] if cls == "elementwise" else 1.0
                bw = (src.memory_bandwidth or 1.0) * e_src * fit
                out[cls] = width * bw / ((tgt.memory_bandwidth or 1.0) * e_tgt)
        return out

    def _fit_comm(self) -> float:
        """The fraction of the source's links that makes the job's modelled collectives
        take their measured time, summed: a plan's time is latency + bandwidth term / eff,
        so two plans (eff 1 and 1/2) give both terms."""
        latency = bandwidth = measured = 0.0
        for step in self.prof.ops:
            for ops in step.values():
                for k in np.flatnonzero([c == "comm" for c in ops.cls]):
                    full = self._plan(self.src_net, self.src_gpus, ops, int(k), 1.0)
                    half = (
                        self._plan(self.src_net, self.src_gpus, ops, int(k), 0.5) if full else None
                    )
                    if full is not None and half is not None:  # both or neither: one group
                        w = half.duration_ns - full.duration_ns
                        latency += full.duration_ns - w
                        bandwidth += w
                        measured += float(ops.dur[k])
        fitted = 1.0
        if measured > latency and bandwidth > 0:
            fitted = min(1.0, bandwidth / (measured - latency))
        self.prof.fitted["comm"] = fitted
        self.prof.basis["comm"] = "fitted" if measured > 0 else "preset"
        return fitted

    def _plan(
        self, net: Network, gpus: list[str], ops: calibrate.StepOps, k: int, eff: float
    ) -> collectives.Plan | None:
        """A collective as the target would run it; None when its group spans other hosts
        or it is not one of the collectives modelled."""
        group, nbytes, name = self._group(ops, k), float(ops.nbytes[k]), ops.collective[k]
        members = ops.members[k]
        machine = Machine(len(gpus), 0.0, 0.0)
        if machine.crosses(group, members) or nbytes <= 0:
            return None
        ranks = [gpus[m % len(gpus)] for m in members] if members else gpus[:group]
        name = name.lower().replace("_", "")
        algo = "tree" if "TREE" in ops.name[k] else "ring"
        if name in ("allreduce",):
            return collectives.plan(net, algo, ranks, nbytes, 0, eff)
        if name in ("allgather", "allgatherbase", "broadcast"):
            return collectives.allgather(net, ranks, nbytes * group, 0, eff)
        if name in ("reducescatter", "reducescatterbase", "reduce"):
            return collectives.reducescatter(net, ranks, nbytes * group, 0, eff)
        if name in ("alltoall", "alltoallbase", "alltoallv"):
            return collectives.alltoall(net, ranks, nbytes, 0, eff)
        return None

    def _group(self, ops: calibrate.StepOps, k: int) -> int:
        """Ranks in op k's collective: the trace's group size, else the whole job."""
        return int(ops.group[k]) or self.prof.world

    def describe(self) -> dict[str, object]:
        p = self.prof
        steps = sorted(d for _, d in p.steps)
        return {
            "kind": "replay",
            **asdict(self.cfg),
            "source_topology": p.source.name,
            "source_precision": p.precision,
            "precision": self.precision,
            "ranks": p.ranks,
            "world_size": p.world,
            "source_steps": len(p.steps),
            "source_step_ms_median": steps[len(steps) // 2] / 1e6,
            "efficiency_fitted": {c: round(v, 4) for c, v in p.fitted.items()},
            "efficiency_basis": dict(p.basis),
            "time_scale": {c: round(v, 4) for c, v in self.scale.items()},
            "device_ms_per_step": p.class_ms(),
        }

    def step(self, s: int) -> float:
        """Replay source step s mod n from the end of the previous one; returns the end
        of its last work (its device work may run on past the step, as in the trace)."""
        name, src_dur = self.prof.steps[s % len(self.prof.steps)]
        if s and s % len(self.prof.steps) == 0:
            self._new_pass()
        tb = self.ctx.table
        trace = tb.new_trace()
        root = tb.ids(1)
        t0, dev_end, src_end = self.t, self.t, self.v
        for r, rank in enumerate(self.prof.ranks):
            ops = self.prof.ops[s % len(self.prof.ops)].get(rank)
            if ops is not None:
                new, old = self._rank(ops, r, trace, int(root[0]))
                dev_end, src_end = max(dev_end, new), max(src_end, old)
        # The step keeps its own length but for how much later its device work ends than
        # the previous step's did: its host time (the gaps) stays as measured.
        drift = dev_end - src_end
        end = t0 + max(0.0, src_dur + drift - self.drift - self.carried)
        tb.add(trace, tb.name(name), t0, end, 0, span_ids=root, attrs=[{"replay.step": s}])
        self.t, self.v, self.drift, self.carried = end, self.v + src_dur, drift, 0.0
        return max(end, dev_end)

    def _new_pass(self) -> None:
        """Start the source steps over. The trace's first step began on idle devices; the
        last step's device work may still be running (a GPU behind its host). Its kernels
        queue behind that work, but the step keeps its length: the host, which in the
        trace did not wait for that work at the step's end, does not wait for it now."""
        self.backlog = {key: new for key, (_, new) in self.chain.items()}
        self.chain.clear()
        self.done.clear()

    def _rank(self, ops: calibrate.StepOps, r: int, trace: int, parent: int) -> tuple[float, float]:
        """Rank r's ops of a step, each stream going on from where its last op ended;
        returns (replay end, trace end) of the last op to end."""
        n, gpu = len(ops.dur), self.gpus[r]
        start, dur = np.zeros(n), np.zeros(n)
        done = self.done.setdefault(r, [])  # (trace end, replay end, stream)
        for k in range(n):
            q, s_src = int(ops.stream[k]), self.v + float(ops.start[k])
            src_prev, new_prev = self.chain.get((r, q), (self.v, self.t))
            # The gap before an op is host time, unless the op waited on another stream's
            # op that ended just before it: then it follows that op instead.
            ready = new_prev + max(0.0, s_src - src_prev)
            busy = self.backlog.pop((r, q), 0.0)  # the last pass's work, first op only
            if busy > ready:
                self.carried, ready = max(self.carried, busy - ready), busy
            for e_src, e_new, q2 in reversed(done[-64:]):
                if q2 != q and s_src - _DEP_NS <= e_src <= s_src:
                    ready = max(new_prev, e_new + (s_src - e_src))
                    break
            start[k], dur[k] = ready, self._duration(ops, k, gpu, ready, trace, parent)
            self.chain[(r, q)] = (s_src + float(ops.dur[k]), ready + dur[k])
            done.append((s_src + float(ops.dur[k]), ready + dur[k], q))
        del done[:-64]
        self._emit(ops, gpu, start, dur, trace, parent)
        return float((start + dur).max()), self.v + float((ops.start + ops.dur).max())

    def _duration(
        self, ops: calibrate.StepOps, k: int, gpu: str, at: float, trace: int, parent: int
    ) -> float:
        cls, d = ops.cls[k], float(ops.dur[k])
        if cls in self.scale:
            return d * self.scale[cls] * self.ctx.slow.get(gpu, 1.0)
        net = self.ctx.network
        if cls == "copy":
            host = self.host[gpu]
            if host is None or ops.nbytes[k] <= 0:
                return d
            route = net.route(host, gpu) if "HtoD" in ops.name[k] else net.route(gpu, host)
            end = net.fluid([at], [route], [float(ops.nbytes[k])])
            name = "h2d" if "HtoD" in ops.name[k] else "d2h"
            tb = self.ctx.table
            transfers(tb, [route], np.array([at]), end, trace, parent, name, ops.nbytes[k])
            return float(end[0]) - at
        key = (
            ops.collective[k],
            int(ops.group[k]),
            float(ops.nbytes[k]),
            ops.name[k],
            ops.members[k],
        )
        if key not in self.plans:
            self.plans[key] = self._plan(net, self.gpus, ops, k, self.comm_eff)
        plan = self.plans[key]
        if plan is None:  # no bytes, or other hosts' ranks: by the links it crosses
            group = self._group(ops, k)
            src, tgt = self.machines
            members = ops.members[k]
            return d * src.bandwidth(group, members) / max(tgt.bandwidth(group, members), 1.0)
        if gpu == self.gpus[0]:  # one rank's flows stand for the collective's
            collectives.emit(self.ctx.table, plan, at, trace, parent)
        return plan.duration_ns

    def _emit(
        self,
        ops: calibrate.StepOps,
        gpu: str,
        start: np.ndarray,
        dur: np.ndarray,
        trace: int,
        parent: int,
    ) -> None:
        tb, chip = self.ctx.table, self.ctx.chip(gpu)
        kinds = np.array([_KIND.get(k, "compute") for k in ops.kind])
        for kind in np.unique(kinds):
            m = np.flatnonzero(kinds == kind)
            names = np.array([tb.name(ops.name[i]) for i in m])
            flops = np.array(
                [self._flops(ops.cls[i], float(ops.dur[i])) for i in m], dtype=np.int64
            )
            tb.add(
                trace,
                names,
                start[m],
                start[m] + dur[m],
                parent,
                chip=chip,
                op=str(kind),
                nbytes=ops.nbytes[m].astype(np.int64),
                flops=flops,
                precision=self.precision if kind == "compute" else None,
            )

    def _flops(self, cls: str, src_ns: float) -> int:
        """An op's work in FLOPs (compute classes): its source time at the source's rate."""
        if cls not in _COMPUTE:
            return -1
        p = self.prof
        e = p.fitted.get(cls, self.eff.of(p.gpu.efficiency, cls, p.precision))
        return int(src_ns / 1e9 * p.gpu.peak_flops[p.precision] * e)
