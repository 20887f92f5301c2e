"""`workload=replay`: a real job's profiler steps (calibrate.py) replayed on another rack.

Each source rank runs on the target GPU of the same index. A step's ops run in their
source order per stream; an op starts after the op before it on its stream plus the gap
the trace shows there (host time: launches, syncs, the data loader: kept as measured), and
after the op of another stream that ended just before it in the trace (the event it waited
on). Op times change with the rack:

- gemm, attention: work = source time x source peak x source efficiency, at the target's
  peak and efficiency in the replay's precision (the trace's unless `precision` is set);
- elementwise, optimizer: the same with memory bandwidth (elementwise bytes scale with the
  precision's width);
- comm: collectives within the target's GPUs are re-planned on its links (collectives.py)
  at the job's fitted comm efficiency; larger groups (other hosts) scale with the NIC
  bandwidth per GPU;
- copy: host-device copies move their bytes over the target's route.

A step lasts as long as its device work plus the host time after it in the trace. Replaying
on the source machine gives the trace's own step times back (comm as fitted on the sum).
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
from chiptrace.emulator.model import BYTES, resolve_precision
from chiptrace.emulator.network import Network
from chiptrace.emulator.topology import Topology
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
        self.nic_ratio = _nic_bw(self.prof.source) / max(_nic_bw(ctx.topology), 1.0)
        cpus = ctx.topology.of_type("cpu")
        # Each GPU's nearest CPU, None without CPUs (host copies then cost nothing extra).
        self.host: dict[str, str | None] = {}
        for g in self.gpus:
            near = ctx.network.nearest(g, cpus)
            self.host[g] = near[0] if near else None
        self.plans: dict[tuple[Any, ...], collectives.Plan | None] = {}  # None: spans hosts
        self.t = 0.0

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
        group, nbytes, name = int(ops.group[k]) or 2, float(ops.nbytes[k]), ops.collective[k]
        if group > len(gpus) or nbytes <= 0:
            return None
        ranks = gpus[:group]
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
            "source_steps": len(p.steps),
            "source_step_ms_median": steps[len(steps) // 2] / 1e6,
            "efficiency_fitted": {c: round(v, 4) for c, v in p.fitted.items()},
            "efficiency_basis": dict(p.basis),
            "time_scale": {c: round(v, 4) for c, v in self.scale.items()},
            "device_ms_per_step": p.class_ms(),
        }

    def step(self, s: int) -> float:
        """Replay source step s mod n from the end of the previous one; returns its end."""
        name, src_dur = self.prof.steps[s % len(self.prof.steps)]
        tb = self.ctx.table
        trace = tb.new_trace()
        root = tb.ids(1)
        t0, end = self.t, self.t
        for r, rank in enumerate(self.prof.ranks):
            ops = self.prof.ops[s % len(self.prof.ops)].get(rank)
            if ops is not None:
                dev_end, src_end = self._rank(ops, self.gpus[r], t0, trace, int(root[0]))
                end = max(end, dev_end + max(0.0, src_dur - src_end))
        tb.add(trace, tb.name(name), t0, end, 0, span_ids=root, attrs=[{"replay.step": s}])
        self.t = end
        return end

    def _rank(
        self, ops: calibrate.StepOps, gpu: str, t0: float, trace: int, parent: int
    ) -> tuple[float, float]:
        """One rank's ops of a step; returns (device end, source device end offset)."""
        n = len(ops.dur)
        start, dur = np.zeros(n), np.zeros(n)
        chain: dict[int, tuple[float, float]] = {}  # stream -> (source end, replay end)
        done: list[tuple[float, float, int]] = []  # (source end, replay end, stream)
        for k in range(n):
            q, s_src = int(ops.stream[k]), float(ops.start[k])
            src_prev, new_prev = chain.get(q, (0.0, t0))
            # The gap before an op is host time, unless the op waited on another stream's
            # op that ended just before it: then it follows that op instead.
            ready = new_prev + max(0.0, s_src - src_prev)
            for e_src, e_new, q2 in reversed(done[-64:]):
                if q2 != q and s_src - _DEP_NS <= e_src <= s_src:
                    ready = max(new_prev, e_new + (s_src - e_src))
                    break
            start[k], dur[k] = ready, self._duration(ops, k, gpu, ready, trace, parent)
            chain[q] = (s_src + float(ops.dur[k]), ready + dur[k])
            done.append((s_src + float(ops.dur[k]), ready + dur[k], q))
        self._emit(ops, gpu, start, dur, trace, parent)
        return float((start + dur).max()), float((ops.start + ops.dur).max())

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
        key = (ops.collective[k], int(ops.group[k]), float(ops.nbytes[k]), ops.name[k])
        if key not in self.plans:
            self.plans[key] = self._plan(net, self.gpus, ops, k, self.comm_eff)
        plan = self.plans[key]
        if plan is None:  # another host's ranks: bound by the NIC bandwidth per GPU
            return d * self.nic_ratio
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


def _nic_bw(topo: Topology) -> float:
    """Network bandwidth per GPU (bytes/s): the NICs' links to switches over the GPUs."""
    bw = sum(
        topo.links[li].bandwidth
        for n in topo.of_type("nic")
        for other, li in topo.adjacency[n]
        if topo.chips[other].type == "switch"
    )
    return bw / max(1, len(topo.of_type("gpu")))
