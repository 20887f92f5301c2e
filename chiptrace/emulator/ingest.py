"""Host-side input: raw training data arrives through a NIC, a CPU loads it, a DPU gets it.

With `host_load_flops_per_byte > 0` each rank's raw input (`input_mb`) comes off the network
before the DPU preprocesses it: the NIC's uplink switch forwards it and the NIC receives it
(one burst per rank, back to back on each NIC at the uplink's bandwidth after faults), a DMA
copies it to the rank's host CPU, the CPU decodes and tokenizes it (roofline time, one rank
after another per CPU), and a copy moves it to the DPU. Every stage is a span: `rx` on the
NIC (io), `forward` on the switch (comm), `load` on the CPU (compute), and link spans for
each wire. Off (0, the default), the input appears on the DPU as before.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from chiptrace.emulator.errors import WorkloadError
from chiptrace.emulator.fabric import Fabric
from chiptrace.emulator.network import Route
from chiptrace.emulator.op_cost import op_ns, resolve_precision
from chiptrace.emulator.scheduler import balanced
from chiptrace.emulator.train_step import transfers

if TYPE_CHECKING:
    from chiptrace.emulator.train import Training


class Ingest:
    """Per-rank NIC, host CPU and uplink switch, and when each NIC and CPU is next free."""

    def __init__(self, tr: Training) -> None:
        topo, net = tr.ctx.topology, tr.ctx.network
        nics = topo.of_type("nic")
        if not nics or not tr.cpus:
            raise WorkloadError(
                f"workload host_load_flops_per_byte > 0 needs NICs and CPUs; topology {topo.name} lacks them"
            )
        self.tr = tr
        self.cpu = {g: tr.host[g] for g in tr.gpus}  # CPUs are there: checked above
        self.nic = balanced(tr.gpus, lambda g: net.nearest(self.cpu[g], nics), nics[0])
        # The wire each NIC receives on: from its widest switch neighbour (None: no uplink).
        self.wire = {n: _uplink(tr, n) for n in set(self.nic.values())}
        self.fabric = Fabric(tr.ctx)
        self.free: dict[str, float] = {}

    def run(self, dpus: list[str], release: float, trace: int, parent: int) -> np.ndarray:
        """Emit one input's host path per rank, released at `release`; returns when each
        rank's raw input is on its DPU (virtual ns)."""
        tr = self.tr
        net, nbytes = tr.ctx.network, tr.cfg.input_mb * 1e6
        rx_s, rx_e = self._receive(release, nbytes, trace, parent)
        cpus = [self.cpu[g] for g in tr.gpus]
        dma = [net.route(self.nic[g], c) for g, c in zip(tr.gpus, cpus, strict=True)]
        at_cpu = net.fluid(rx_e, dma, [nbytes] * len(dma))
        transfers(self.tr.ctx.table, dma, rx_e, at_cpu, trace, parent, "rx.dma", nbytes, op="io")
        ld_e = self._load(cpus, at_cpu, nbytes, trace, parent)
        to_dpu = [net.route(c, d) for c, d in zip(cpus, dpus, strict=True)]
        at_dpu = net.fluid(ld_e, to_dpu, [nbytes] * len(to_dpu))
        transfers(self.tr.ctx.table, to_dpu, ld_e, at_dpu, trace, parent, "h2dpu", nbytes)
        return at_dpu

    def _receive(
        self, release: float, nbytes: float, trace: int, parent: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """Bursts back to back per NIC: each takes the wire's latency plus bytes / bandwidth."""
        tr, tb = self.tr, self.tr.ctx.table
        n = len(tr.gpus)
        starts, ends = np.zeros(n), np.zeros(n)
        for i, g in enumerate(tr.gpus):
            nic, wire = self.nic[g], self.wire[self.nic[g]]
            bw = float(tr.ctx.network.dir_bw[wire.dirs].min()) if wire else _pcie_bw(tr, nic)
            starts[i] = max(self.free.get(nic, 0.0), release) + tr.ctx.delay.get(nic, 0.0)
            ends[i] = (
                starts[i]
                + (wire.latency_ns if wire else 0.0)
                + nbytes / bw * 1e9 * tr.ctx.slow.get(nic, 1.0)
            )
            self.free[nic] = ends[i]
        nics = [self.nic[g] for g in tr.gpus]
        rx = tb.add(
            trace,
            tb.name("rx"),
            starts,
            ends,
            parent,
            chip=np.array([tr.ctx.chip(x) for x in nics]),
            op="io",
            nbytes=int(nbytes),
        )
        uplinks = [(i, r) for i, x in enumerate(nics) if (r := self.wire[x]) is not None]
        if uplinks:
            wired = [i for i, _ in uplinks]
            routes = [r for _, r in uplinks]
            transfers(
                tb, routes, starts[wired], ends[wired], trace, parent, "rx.wire", nbytes, op="io"
            )
            sw = np.array([self.fabric.switches_of(r.dirs)[0] for r in routes])
            self.fabric.forward_union(
                sw, starts[wired], ends[wired], nbytes, trace, parent, rx[wired]
            )
        return starts, ends

    def _load(
        self, cpus: list[str], ready: np.ndarray, nbytes: float, trace: int, parent: int
    ) -> np.ndarray:
        """Decode and tokenize on the host CPU, one rank after another per CPU."""
        ctx, fpb = self.tr.ctx, self.tr.cfg.host_load_flops_per_byte
        starts, ends = np.zeros(len(cpus)), np.zeros(len(cpus))
        for i in np.argsort(ready, kind="stable"):  # in arrival order
            c = ctx.topology.chips[cpus[i]]
            starts[i] = max(float(ready[i]), self.free.get(c.id, 0.0)) + ctx.delay.get(c.id, 0.0)
            prec = resolve_precision(c, "fp32")
            ends[i] = starts[i] + op_ns(
                c,
                [("elementwise", nbytes * fpb, 2 * nbytes)],
                prec,
                self.tr.eff,
                ctx.slow.get(c.id, 1.0),
            )
            self.free[c.id] = ends[i]
        tb = ctx.table
        tb.add(
            trace,
            tb.name("load"),
            starts,
            ends,
            parent,
            chip=np.array([ctx.chip(c) for c in cpus]),
            op="compute",
            nbytes=int(2 * nbytes),
            flops=int(nbytes * fpb),
            precision="fp32",
        )
        return ends


def _uplink(tr: Training, nic: str) -> Route | None:
    topo, net = tr.ctx.topology, tr.ctx.network
    switches = [
        (topo.links[li].bandwidth, nbr)
        for nbr, li in topo.adjacency[nic]
        if topo.chips[nbr].type == "switch"
    ]
    return net.route(max(switches)[1], nic) if switches else None


def _pcie_bw(tr: Training, nic: str) -> float:
    topo = tr.ctx.topology
    return max(topo.links[li].bandwidth for _, li in topo.adjacency[nic])
