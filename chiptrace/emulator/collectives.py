"""Collectives as NumPy: ring and tree all-reduce over the network's routes and planes.

A collective is a list of rounds. In a round every flow starts together (each rank waits
for the round before, as NCCL's steps do) and moves the same bytes, so `static_share` gives
each flow's time exactly, and the round lasts as long as its slowest flow. Ring all-reduce
is one round shape repeated 2(n-1) times, so thousands of flows cost a few array ops. Each
flow is one span per hop, emitted in bulk.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from chiptrace.emulator.network import Network, Route
from chiptrace.emulator.spans import SpanTable

ALGORITHMS = ("ring", "tree")


@dataclass(frozen=True, slots=True)
class Round:
    """Flows that start together: (flows, hops) direction ids (-1 pads), bytes, latency."""

    dirs: np.ndarray
    nbytes: np.ndarray
    latency: np.ndarray
    repeat: int = 1


def _round(routes: Sequence[Route], nbytes: float, repeat: int = 1) -> Round:
    hops = max(len(r.dirs) for r in routes)
    dirs = np.full((len(routes), hops), -1, dtype=np.int64)
    for i, r in enumerate(routes):
        dirs[i, : len(r.dirs)] = r.dirs
    lat = np.array([r.latency_ns for r in routes])
    return Round(dirs, np.full(len(routes), nbytes), lat, repeat)


def _striped(
    net: Network, pairs: Sequence[tuple[str, str]], channels: int
) -> tuple[list[Route], int]:
    """One route per (pair, channel): channel c of a pair takes its c-th parallel plane."""
    planes = [net.planes(a, b) for a, b in pairs]
    c = channels or min(len(p) for p in planes)
    return [p[k % len(p)] for p in planes for k in range(c)], c


def ring_allreduce(
    net: Network, ranks: Sequence[str], nbytes: float, channels: int = 0
) -> list[Round]:
    """Reduce-scatter then all-gather around the ring: 2(n-1) rounds of S/n bytes per rank
    (split over `channels` planes; 0 = every parallel plane the ring's hops have)."""
    n = len(ranks)
    if n < 2:
        return []
    routes, c = _striped(net, [(ranks[i], ranks[(i + 1) % n]) for i in range(n)], channels)
    return [_round(routes, nbytes / n / c, 2 * (n - 1))]


def tree_allreduce(
    net: Network, ranks: Sequence[str], nbytes: float, channels: int = 0
) -> list[Round]:
    """Reduce up a binary tree (rank i's parent is (i-1)//2), then broadcast down: one round
    per tree level each way, each moving the whole buffer."""
    n = len(ranks)
    if n < 2:
        return []
    depth = int(np.floor(np.log2(n)))
    levels = [
        [i for i in range(1, n) if int(np.floor(np.log2(i + 1))) == d] for d in range(1, depth + 1)
    ]
    up, down = [], []
    for lv in reversed(levels):
        routes, c = _striped(net, [(ranks[i], ranks[(i - 1) // 2]) for i in lv], channels)
        up.append(_round(routes, nbytes / c))
    for lv in levels:
        routes, c = _striped(net, [(ranks[(i - 1) // 2], ranks[i]) for i in lv], channels)
        down.append(_round(routes, nbytes / c))
    return up + down


def plan(
    net: Network, algorithm: str, ranks: Sequence[str], nbytes: float, channels: int = 0
) -> list[Round]:
    """The rounds of an all-reduce of `nbytes` per rank."""
    return (ring_allreduce if algorithm == "ring" else tree_allreduce)(net, ranks, nbytes, channels)


def duration_ns(net: Network, rounds: Sequence[Round]) -> float:
    """Total time of a collective (sum of its rounds' slowest flows)."""
    return float(
        sum(net.static_share(r.dirs, r.nbytes, r.latency).max() * r.repeat for r in rounds)
    )


def emit(
    table: SpanTable,
    net: Network,
    rounds: Sequence[Round],
    start: float,
    trace: int,
    parent: int,
    name: int,
) -> float:
    """Add one span per flow hop per round, starting at `start`; returns the end time."""
    t = float(start)
    for r in rounds:
        dur = net.static_share(r.dirs, r.nbytes, r.latency)
        step = float(dur.max())
        k = np.arange(r.repeat, dtype=np.float64)[:, None, None] * step + t
        starts = np.broadcast_to(k, (r.repeat, *r.dirs.shape))
        ends = starts + dur[None, :, None]
        dirs = np.broadcast_to(r.dirs[None], starts.shape)
        nb = np.broadcast_to(r.nbytes[None, :, None], starts.shape)
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
        t += step * r.repeat
    return t
