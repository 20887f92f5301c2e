"""Collectives as NumPy, the way NCCL runs them: ring and tree all-reduce, all-gather,
reduce-scatter and all-to-all over the network's routes and switch planes.

A collective is a Plan: a list of rounds, each a set of flows with their start and end
within the round, repeated back to back. Times come from the network's max-min fair fluid
model once per plan (plans are cached per size by the workloads), so emitting a bucket is
a few array ops whatever the rank count.

- ring all-reduce: reduce-scatter then all-gather around the ring, 2(n-1) steps of S/n per
  rank. NCCL pipelines chunks through the ring, so each step pays the route latency once
  and the links stay busy: T = 2(n-1) a + 2(n-1)/n S/B.
- tree all-reduce: NCCL's double binary tree, pipelined in chunks (trees.py):
  T ~ 2 D a + 2 S/B.
- `auto`: the cheaper of the two for this size on this rack, as NCCL's tuner picks the
  algorithm its cost model says is fastest: trees for small buffers on many ranks, rings for
  large ones.
- all-gather / reduce-scatter (FSDP, ZeRO): n-1 ring steps of S/n: T = (n-1) a + (n-1)/n S/B,
  S the gathered (or scattered) buffer.
- all-to-all (expert parallelism): every rank sends S/n to every other at once:
  T = a + (n-1)/n S/B on one switch; each pair takes one switch plane, spread over the planes.

`eff` is the fraction of a link a collective's kernels drive (NCCL's protocol overhead,
efficiency.py `comm`): the collective's flows share the links at that fraction of their
bandwidth, max-min fairly as any transfers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from chiptrace.emulator import trees
from chiptrace.emulator.network import Network, Route
from chiptrace.emulator.spans import SpanTable

ALGORITHMS = ("ring", "tree", "auto")  # all-reduce
KINDS = ("allreduce", "allgather", "reducescatter", "alltoall")


@dataclass(frozen=True, slots=True)
class Round:
    """Flows of one collective step: (flows, hops) direction ids (-1 pads), bytes per flow,
    each flow's start and end after the round's start (ns); the round lasts `period` and
    runs `repeat` times back to back."""

    dirs: np.ndarray
    nbytes: np.ndarray
    start: np.ndarray
    end: np.ndarray
    period: float
    repeat: int = 1


@dataclass(frozen=True, slots=True)
class Plan:
    """A collective's rounds; `name` is its flows' span name (`allreduce.ring`, ...)."""

    name: str
    rounds: tuple[Round, ...]

    @property
    def duration_ns(self) -> float:
        return float(sum(r.period * r.repeat for r in self.rounds))


def _round(
    net: Network, routes: Sequence[Route], nbytes: np.ndarray, repeat: int, eff: float
) -> Round:
    """Flows that start together (`nbytes` each), timed by the fluid model."""
    dirs = net.dirs_of(routes)
    lat = np.array([r.latency_ns for r in routes], dtype=np.float64)
    size = np.asarray(nbytes, dtype=np.float64)
    end = net.flows(dirs, size, lat, 0.0, eff)
    return Round(dirs, size, np.zeros(len(routes)), end, float(end.max()), repeat)


def _ring(
    net: Network, ranks: Sequence[str], nbytes: float, steps: int, channels: int, eff: float
) -> tuple[Round, ...]:
    n = len(ranks)
    if n < 2:
        return ()
    routes, share = net.striped([(ranks[i], ranks[(i + 1) % n]) for i in range(n)], channels)
    return (_round(net, routes, nbytes / n * share, steps, eff),)


def ring_allreduce(
    net: Network, ranks: Sequence[str], nbytes: float, channels: int = 0, eff: float = 1.0
) -> Plan:
    """Reduce-scatter then all-gather around the ring: 2(n-1) rounds of S/n bytes per rank
    (split over `channels` planes; 0 = every parallel plane the ring's hops have)."""
    rounds = _ring(net, ranks, nbytes, 2 * (len(ranks) - 1), channels, eff)
    return Plan("allreduce.ring", rounds)


def tree_allreduce(
    net: Network, ranks: Sequence[str], nbytes: float, channels: int = 0, eff: float = 1.0
) -> Plan:
    """NCCL's pipelined double binary tree (trees.py): each tree reduces and broadcasts half."""
    if len(ranks) < 2:
        return Plan("allreduce.tree", ())
    routes, phase, depth, share = trees.tree_flows(net, ranks, channels)
    size = nbytes / 2 * share
    dirs, start, end, period = trees.pipeline(net, routes, phase, depth, size, eff)
    return Plan("allreduce.tree", (Round(dirs, size, start, end, period),))


def allgather(
    net: Network, ranks: Sequence[str], nbytes: float, channels: int = 0, eff: float = 1.0
) -> Plan:
    """Ring all-gather of a `nbytes` buffer (each rank holds nbytes / n): n-1 rounds."""
    return Plan("allgather.ring", _ring(net, ranks, nbytes, len(ranks) - 1, channels, eff))


def reducescatter(
    net: Network, ranks: Sequence[str], nbytes: float, channels: int = 0, eff: float = 1.0
) -> Plan:
    """Ring reduce-scatter of a `nbytes` buffer per rank (each keeps nbytes / n): n-1 rounds."""
    return Plan("reducescatter.ring", _ring(net, ranks, nbytes, len(ranks) - 1, channels, eff))


def alltoall(
    net: Network, ranks: Sequence[str], nbytes: float, channels: int = 0, eff: float = 1.0
) -> Plan:
    """Every rank sends nbytes / n to each other rank, all at once, each pair over
    `channels` flows (0: the fewest that spread every rank's flows within 5% of evenly over
    the switch planes). Flow k of pair (i, j) takes plane (c ((j - i) mod n) + k) mod planes:
    a rank's sends, and its receives, each cover consecutive planes."""
    n = len(ranks)
    if n < 2:
        return Plan("alltoall", ())
    ways = {(i, j): net.planes(ranks[i], ranks[j]) for i in range(n) for j in range(n) if i != j}
    # The plane count of a healthy pair: a pair that lost a link to a fault spreads the
    # same channels over the planes it has left, and every other pair keeps its own.
    c = channels or _spread(n - 1, max(len(w) for w in ways.values()))
    routes = [w[(c * ((j - i) % n) + k) % len(w)] for (i, j), w in ways.items() for k in range(c)]
    return Plan("alltoall", (_round(net, routes, np.full(len(routes), nbytes / n / c), 1, eff),))


def _spread(flows: int, planes: int) -> int:
    """Channels per pair so that `flows` pairs' channels load `planes` planes within 5%."""
    for c in range(1, planes + 1):
        load = flows * c / planes
        if -(-flows * c // planes) <= load * 1.05:
            return c
    return planes


def plan(
    net: Network,
    algorithm: str,
    ranks: Sequence[str],
    nbytes: float,
    channels: int = 0,
    eff: float = 1.0,
) -> Plan:
    """An all-reduce of `nbytes` per rank: `ring`, `tree`, or `auto` (the faster here)."""
    if algorithm == "ring":
        return ring_allreduce(net, ranks, nbytes, channels, eff)
    if algorithm == "tree":
        return tree_allreduce(net, ranks, nbytes, channels, eff)
    ring = ring_allreduce(net, ranks, nbytes, channels, eff)
    tree = tree_allreduce(net, ranks, nbytes, channels, eff)
    return tree if tree.duration_ns < ring.duration_ns else ring


def emit(
    table: SpanTable, p: Plan, start: float, trace: int, parent: int, name: int | None = None
) -> float:
    """Add one span per flow hop per round of plan `p`, from `start`; returns the end."""
    t = float(start)
    name = table.name(p.name) if name is None else name
    for r in p.rounds:
        k = np.arange(r.repeat, dtype=np.float64)[:, None, None] * r.period + t
        shape = (r.repeat, *r.dirs.shape)
        starts = np.broadcast_to(k + r.start[None, :, None], shape)
        ends = np.broadcast_to(k + r.end[None, :, None], shape)
        dirs = np.broadcast_to(r.dirs[None], shape)
        nb = np.broadcast_to(r.nbytes[None, :, None], shape)
        valid = dirs >= 0
        table.add(
            trace,
            name,
            starts[valid],
            ends[valid],
            parent,
            dir=dirs[valid],
            op="comm",
            nbytes=np.rint(nb[valid]).astype(np.int64),
        )
        t += r.period * r.repeat
    return t
