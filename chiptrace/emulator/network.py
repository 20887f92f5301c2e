"""Links in motion: routes through switches, and bandwidth shared between transfers.

Every link is full duplex, so the unit of contention is a link *direction*: id
`2 * link_index + (0 if a->b else 1)`. A transfer over a route takes the route's latency
(summed over hops) plus its bytes over the bandwidth it gets along the route: switches cut
through. Transfers in flight share each direction max-min fairly across their whole routes
(sharing.py): a flow held back on one hop hands what it cannot use of the others back to
the flows beside it, and rates are refilled at every arrival and completion.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from chiptrace.emulator.errors import TopologyError
from chiptrace.emulator.sharing import fluid_ends
from chiptrace.emulator.topology_files import FORWARDERS, Topology

_PROBE_BYTES = 1e6  # route cost = latency + time for 1 MB: prefers wide paths, then short ones


@dataclass(frozen=True, slots=True)
class Route:
    """One path: direction ids per hop, and the summed latency in ns."""

    src: str
    dst: str
    dirs: tuple[int, ...]
    latency_ns: float


class Network:
    """Routing and per-direction bandwidth of a topology (after faults).

    Args:
        topology: the rack.
        bandwidth: per-link bandwidth in bytes/s (defaults to the declared figures; faults
            pass degraded values).
        down: ids of links taken down by faults (named when a route is missing).
    """

    def __init__(
        self, topology: Topology, bandwidth: Sequence[float] | None = None, down: Sequence[str] = ()
    ) -> None:
        self.topology = topology
        self.down = list(down)
        bw = np.array(
            [lk.bandwidth for lk in topology.links] if bandwidth is None else bandwidth,
            dtype=np.float64,
        )
        self.dir_bw = np.repeat(bw, 2)  # both directions of a link have the whole bandwidth
        self.dir_latency = np.repeat(
            np.array([lk.latency_ns for lk in topology.links], dtype=np.float64), 2
        )
        self._routes: dict[tuple[str, str], Route] = {}
        self._planes: dict[tuple[str, str], list[Route]] = {}
        self._trees: dict[tuple[str, frozenset[str]], dict[str, tuple[str, int]]] = {}

    def dir_endpoints(self, d: int) -> tuple[str, str]:
        """(src, dst) chip ids of direction `d`."""
        lk = self.topology.links[d // 2]
        return (lk.src, lk.dst) if d % 2 == 0 else (lk.dst, lk.src)

    def route(self, src: str, dst: str) -> Route:
        """The cheapest route from src to dst (Dijkstra; GPUs and NPUs do not forward).

        Raises:
            TopologyError: no route (a missing link, or one taken down by a fault).
        """
        key = (src, dst)
        if key not in self._routes:
            for c in (src, dst):
                if c not in self.topology.chips:
                    raise TopologyError(
                        f"{self.topology.source}: no chip {c} in topology {self.topology.name}"
                    )
            # Switch fabrics first: GPU-to-GPU traffic takes NVLink even where a CPU's C2C
            # would be wider; root complexes and NICs forward only when nothing else joins.
            route = self._path(src, dst, frozenset({"switch"})) or self._path(src, dst, FORWARDERS)
            if route is None:
                why = f" (links down: {', '.join(self.down)})" if self.down else ""
                raise TopologyError(
                    f"no route from {src} to {dst} in topology {self.topology.name}{why}"
                )
            self._routes[key] = route
        return self._routes[key]

    def reaches(self, src: str, dst: str) -> bool:
        """Whether any route joins src to dst (as `route` looks for one)."""
        try:
            self.route(src, dst)
        except TopologyError:
            return False
        return True

    def nearest(self, src: str, candidates: Sequence[str]) -> list[str]:
        """The candidates cheapest to reach from src, equals all (in `candidates` order):
        Dijkstra, stopped once it settles a chip dearer than the first candidate found,
        so a GPU's own host CPU costs one hop to find."""
        topo = self.topology
        wanted = set(candidates)
        best: dict[str, float] = {src: 0.0}
        found: list[str] = []
        heap = [(0.0, src)]
        while heap:
            cost, node = heapq.heappop(heap)
            if cost > best.get(node, np.inf):
                continue
            if found and cost > best[found[0]] * (1 + 1e-9):
                break
            if node in wanted:
                found.append(node)
                continue
            if node != src and topo.chips[node].type not in FORWARDERS:
                continue
            for nxt, li in topo.adjacency[node]:
                d = 2 * li + (0 if topo.links[li].src == node else 1)
                c = cost + self.dir_latency[d] + _PROBE_BYTES / self.dir_bw[d] * 1e9
                if c < best.get(nxt, np.inf):
                    best[nxt] = c
                    heapq.heappush(heap, (c, nxt))
        return [c for c in candidates if c in found]

    def _path(self, src: str, dst: str, forwarders: frozenset[str]) -> Route | None:
        if src == dst:
            return Route(src, dst, (), 0.0)
        prev = self._tree(src, forwarders)
        if dst not in prev:
            return None
        dirs: list[int] = []
        node = dst
        while node != src:
            node, d = prev[node]
            dirs.append(d)
        dirs.reverse()
        return Route(src, dst, tuple(dirs), float(sum(self.dir_latency[d] for d in dirs)))

    def _tree(self, src: str, forwarders: frozenset[str]) -> dict[str, tuple[str, int]]:
        """Dijkstra from src to every chip (the hop into each, cached per source): one run
        serves all of a source's routes, which an all-to-all on 72 GPUs needs 5,112 of
        (one run per pair cost ~5 ms each there)."""
        key = (src, forwarders)
        if key in self._trees:
            return self._trees[key]
        topo = self.topology
        best: dict[str, float] = {src: 0.0}
        prev: dict[str, tuple[str, int]] = {}
        heap = [(0.0, src)]
        while heap:
            cost, node = heapq.heappop(heap)
            if cost > best.get(node, np.inf) or (
                node != src and topo.chips[node].type not in forwarders
            ):
                continue
            for nxt, li in topo.adjacency[node]:
                d = 2 * li + (0 if topo.links[li].src == node else 1)
                c = cost + self.dir_latency[d] + _PROBE_BYTES / self.dir_bw[d] * 1e9
                if c < best.get(nxt, np.inf):
                    best[nxt], prev[nxt] = c, (node, d)
                    heapq.heappush(heap, (c, nxt))
        self._trees[key] = prev
        return prev

    def planes(self, src: str, dst: str) -> list[Route]:
        """Parallel routes src -> switch -> dst through every switch that joins both ends
        with the same link types (an NVL72's 18 NVLink switch planes); else the one route."""
        key = (src, dst)
        if key in self._planes:
            return self._planes[key]
        base = self.route(src, dst)
        out = [base]
        if len(base.dirs) == 2:
            topo = self.topology
            mid = self.dir_endpoints(base.dirs[0])[1]
            t0, t1 = (topo.links[d // 2].type for d in base.dirs)
            if topo.chips[mid].type == "switch":
                ups = {n: li for n, li in topo.adjacency[src] if topo.links[li].type == t0}
                downs = {n: li for n, li in topo.adjacency[dst] if topo.links[li].type == t1}
                for sw in sorted(set(ups) & set(downs) - {mid}, key=_chip_order):
                    if topo.chips[sw].type != "switch":
                        continue
                    d0 = 2 * ups[sw] + (0 if topo.links[ups[sw]].src == src else 1)
                    d1 = 2 * downs[sw] + (0 if topo.links[downs[sw]].src == sw else 1)
                    out.append(
                        Route(
                            src, dst, (d0, d1), float(self.dir_latency[d0] + self.dir_latency[d1])
                        )
                    )
        self._planes[key] = out
        return out

    def striped(
        self, pairs: Sequence[tuple[str, str]], channels: int
    ) -> tuple[list[Route], np.ndarray]:
        """Routes of each pair's channels and the share of the pair's bytes each carries.

        With `channels` 0 a pair spreads its bytes evenly over every parallel plane it has, as
        an NVSwitch fabric sprays a pair's traffic over all its links: a pair that lost one
        link to a fault uses the planes it has left and the other pairs keep all of theirs.
        With `channels` c, channel k of a pair takes its k-th plane (wrapping round).
        """
        routes: list[Route] = []
        share: list[float] = []
        for a, b in pairs:
            ways = self.planes(a, b)
            c = channels or len(ways)
            routes.extend(ways[k % len(ways)] for k in range(c))
            share.extend([1.0 / c] * c)
        return routes, np.array(share, dtype=np.float64)

    def dirs_of(self, routes: Sequence[Route]) -> np.ndarray:
        """(routes, hops) direction ids, -1 padding the shorter routes."""
        hops = max((len(r.dirs) for r in routes), default=0)
        dirs = np.full((len(routes), hops), -1, dtype=np.int64)
        for i, r in enumerate(routes):
            dirs[i, : len(r.dirs)] = r.dirs
        return dirs

    def flows(
        self,
        dirs: np.ndarray,
        nbytes: np.ndarray,
        latency: np.ndarray,
        starts: np.ndarray | float = 0.0,
        eff: float = 1.0,
    ) -> np.ndarray:
        """End times (ns) of transfers given as direction arrays: each waits its latency,
        then moves its bytes at its max-min fair share (sharing.fluid_ends) of the links
        at `eff` of their bandwidth (a collective's kernels drive that much of a link)."""
        ready = np.broadcast_to(np.asarray(starts, dtype=np.float64), len(nbytes)) + latency
        capacity = self.dir_bw if eff >= 1 else self.dir_bw * eff
        return fluid_ends(dirs, np.asarray(nbytes, dtype=np.float64), ready, capacity)

    def fluid(
        self,
        starts: Sequence[float] | np.ndarray,
        routes: Sequence[Route],
        nbytes: Sequence[float],
    ) -> np.ndarray:
        """End times (ns) of transfers along routes, starting at `starts` (ns): route
        latency, then bytes at the max-min fair rate among the transfers in flight."""
        lat = np.array([r.latency_ns for r in routes], dtype=np.float64)
        return self.flows(
            self.dirs_of(routes),
            np.asarray(nbytes, dtype=np.float64),
            lat,
            np.asarray(starts, dtype=np.float64),
        )


def _chip_order(chip_id: str) -> tuple[str, int]:
    t, _, i = chip_id.partition(":")
    return (t, int(i) if i.isdigit() else 0)
