"""Where a replayed job's collectives run: within one host or across hosts, and the
bandwidth a GPU gets on the links each kind crosses (replay.py scales the collectives it
cannot re-plan by these figures).

A job of `world` ranks fills hosts of `per_host` GPUs in rank order, as torchrun places
them; a collective stays within a host when its ranks (the trace's `Process Group Ranks`)
share one, or, where the trace names only a group size, when the group fits one. Within a
host a collective crosses the GPUs' own fabric (NVLink, or PCIe where there is none);
across hosts, the network links of the NICs (Ethernet, InfiniBand) shared by the host's
GPUs. Root-complex and PCIe-switch links to a NIC are not counted: every collective that
crosses them also crosses the NIC's network link, which is the narrower.
"""

from __future__ import annotations

from dataclasses import dataclass

from chiptrace.emulator.network import Network
from chiptrace.emulator.topology_files import Topology

NETWORK_LINKS = ("ethernet", "infiniband")


def nic_bw(topo: Topology) -> float:
    """Network bandwidth per GPU (bytes/s): the NICs' network links over the GPUs."""
    bw = sum(
        lk.bandwidth
        for lk in topo.links
        if lk.type in NETWORK_LINKS
        and (topo.chips[lk.src].type == "nic" or topo.chips[lk.dst].type == "nic")
    )
    return bw / max(1, len(topo.of_type("gpu")))


def intra_bw(net: Network) -> float:
    """A GPU's bandwidth to a peer on its host (bytes/s): the narrowest link of each
    parallel route between two GPUs, summed over the routes (NVL72's 18 planes)."""
    gpus = net.topology.of_type("gpu")
    if len(gpus) < 2:
        return nic_bw(net.topology) or 1.0
    routes = net.planes(gpus[0], gpus[1])
    return float(sum(min(net.dir_bw[d] for d in r.dirs) for r in routes if r.dirs))


@dataclass(frozen=True)
class Machine:
    """One machine's GPUs per host and the two bandwidths a collective can be bound by."""

    per_host: int
    intra: float
    network: float

    @classmethod
    def of(cls, net: Network) -> Machine:
        return cls(max(1, len(net.topology.of_type("gpu"))), intra_bw(net), nic_bw(net.topology))

    def crosses(self, group: int, members: tuple[int, ...] = ()) -> bool:
        """Whether a collective spans hosts here: its global ranks (`members`, where the
        trace names them) on more than one host, else `group` consecutive ranks more
        than a host holds."""
        if members:
            return len({m // self.per_host for m in members}) > 1
        return group > self.per_host

    def bandwidth(self, group: int, members: tuple[int, ...] = ()) -> float:
        """What a collective of `group` ranks gets per GPU: the network's share across
        hosts (the fabric where a machine has no NICs), the fabric within one."""
        return (self.network or self.intra) if self.crosses(group, members) else self.intra
