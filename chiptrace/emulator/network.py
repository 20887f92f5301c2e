"""Links in motion: routes through switches, and bandwidth shared between transfers.

Every link is full duplex, so the unit of contention is a link *direction*: id
`2 * link_index + (0 if a->b else 1)`. A transfer over a route takes the route's latency
(summed over hops) plus its bytes over the narrowest bandwidth it gets along the route:
switches cut through. Two models of sharing, one exact and one fast:

- `fluid`: an event-driven fair-share simulation (each active transfer gets, on every
  direction it crosses, an equal share; its rate is the smallest of those shares; rates are
  recomputed at every arrival and completion). Used for irregular traffic.
- `static_share`: flows that start together and are equal in size (a collective step) get
  `bandwidth / flows on that direction` for their whole life: the fluid model's answer for
  that case, computed with NumPy for thousands of flows at once.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from chiptrace.emulator.errors import TopologyError
from chiptrace.emulator.topology import FORWARDERS, Topology

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

    def dir_endpoints(self, d: int) -> tuple[str, str]:
        """(src, dst) chip ids of direction `d`."""
        lk = self.topology.links[d // 2]
        return (lk.a, lk.b) if d % 2 == 0 else (lk.b, lk.a)

    def route(self, src: str, dst: str) -> Route:
        """The cheapest route from src to dst (Dijkstra; GPUs and NPUs do not forward).

        Raises:
            TopologyError: no route (a missing link, or one taken down by a fault).
        """
        key = (src, dst)
        if key not in self._routes:
            # Switch fabrics first: GPU-to-GPU traffic takes NVLink even where a CPU's C2C
            # would be wider; root complexes and NICs forward only when nothing else joins.
            route = self._dijkstra(src, dst, frozenset({"switch"}))
            self._routes[key] = route or self._dijkstra(src, dst, FORWARDERS)
            if self._routes[key] is None:
                why = f" (links down: {', '.join(self.down)})" if self.down else ""
                raise TopologyError(
                    f"no route from {src} to {dst} in topology {self.topology.name}{why}"
                )
        return self._routes[key]

    def nearest(self, src: str, candidates: Sequence[str]) -> str | None:
        """The candidate cheapest to reach from src: Dijkstra, stopped at the first candidate
        it settles (which is the cheapest), so a GPU's own host CPU costs one hop to find."""
        topo = self.topology
        wanted = set(candidates)
        best: dict[str, float] = {src: 0.0}
        heap = [(0.0, src)]
        while heap:
            cost, node = heapq.heappop(heap)
            if cost > best.get(node, np.inf):
                continue
            if node in wanted:
                return node
            if node != src and topo.chips[node].type not in FORWARDERS:
                continue
            for nxt, li in topo.adjacency[node]:
                d = 2 * li + (0 if topo.links[li].a == node else 1)
                c = cost + self.dir_latency[d] + _PROBE_BYTES / self.dir_bw[d] * 1e9
                if c < best.get(nxt, np.inf):
                    best[nxt] = c
                    heapq.heappush(heap, (c, nxt))
        return None

    def _dijkstra(self, src: str, dst: str, forwarders: frozenset[str]) -> Route | None:
        topo = self.topology
        for c in (src, dst):
            if c not in topo.chips:
                raise TopologyError(f"{topo.source}: no chip {c} in topology {topo.name}")
        best: dict[str, float] = {src: 0.0}
        prev: dict[str, tuple[str, int]] = {}
        heap = [(0.0, src)]
        while heap:
            cost, node = heapq.heappop(heap)
            if node == dst:
                break
            if cost > best.get(node, np.inf) or (
                node != src and topo.chips[node].type not in forwarders
            ):
                continue
            for nxt, li in topo.adjacency[node]:
                d = 2 * li + (0 if topo.links[li].a == node else 1)
                c = cost + self.dir_latency[d] + _PROBE_BYTES / self.dir_bw[d] * 1e9
                if c < best.get(nxt, np.inf):
                    best[nxt], prev[nxt] = c, (node, d)
                    heapq.heappush(heap, (c, nxt))
        if dst not in prev and src != dst:
            return None
        dirs: list[int] = []
        node = dst
        while node != src:
            node, d = prev[node]
            dirs.append(d)
        dirs.reverse()
        return Route(src, dst, tuple(dirs), float(sum(self.dir_latency[d] for d in dirs)))

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
                    d0 = 2 * ups[sw] + (0 if topo.links[ups[sw]].a == src else 1)
                    d1 = 2 * downs[sw] + (0 if topo.links[downs[sw]].a == sw else 1)
                    out.append(
                        Route(
                            src, dst, (d0, d1), float(self.dir_latency[d0] + self.dir_latency[d1])
                        )
                    )
        self._planes[key] = out
        return out

    def static_share(self, dirs: np.ndarray, nbytes: np.ndarray, latency: np.ndarray) -> np.ndarray:
        """Durations (ns) of flows that start together, sharing each direction equally.

        Args:
            dirs: (flows, hops) direction ids; -1 pads shorter routes.
            nbytes: bytes per flow.
            latency: route latency per flow, ns.
        """
        valid = dirs >= 0
        counts = np.bincount(dirs[valid], minlength=len(self.dir_bw))
        share = np.where(
            valid,
            self.dir_bw[np.where(valid, dirs, 0)] / np.maximum(counts[np.where(valid, dirs, 0)], 1),
            np.inf,
        )
        return latency + nbytes / share.min(axis=1) * 1e9

    def fluid(
        self, starts: Sequence[float], routes: Sequence[Route], nbytes: Sequence[float]
    ) -> np.ndarray:
        """End times (ns) of transfers under fair sharing of each link direction.

        A transfer waits its route latency, then moves its bytes at its current rate: the
        smallest, over its hops, of the direction's bandwidth divided by the transfers on it.
        """
        n = len(starts)
        end = np.zeros(n)
        arrivals = sorted(
            (float(s) + r.latency_ns, i)
            for i, (s, r) in enumerate(zip(starts, routes, strict=True))
        )
        remaining = np.array(nbytes, dtype=np.float64)
        active: list[int] = []
        t, k = 0.0, 0
        while k < len(arrivals) or active:
            if not active:
                t = max(t, arrivals[k][0])
            while k < len(arrivals) and arrivals[k][0] <= t:
                active.append(arrivals[k][1])
                k += 1
            counts: dict[int, int] = {}
            for i in active:
                for d in routes[i].dirs:
                    counts[d] = counts.get(d, 0) + 1
            rates = [
                min((self.dir_bw[d] / counts[d] for d in routes[i].dirs), default=np.inf)
                for i in active
            ]
            finish = [
                remaining[i] / r * 1e9 if r != np.inf else 0.0
                for i, r in zip(active, rates, strict=True)
            ]
            step = min(finish)
            if k < len(arrivals):
                step = min(step, arrivals[k][0] - t)
            t += step
            still = []
            for i, r, f in zip(active, rates, finish, strict=True):
                if f <= step * (1 + 1e-12) + 1e-9:
                    end[i] = t
                else:
                    remaining[i] -= r * step / 1e9
                    still.append(i)
            active = still
        return end


def _chip_order(chip_id: str) -> tuple[str, int]:
    t, _, i = chip_id.partition(":")
    return (t, int(i) if i.isdigit() else 0)
