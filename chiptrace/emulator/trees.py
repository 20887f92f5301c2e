"""NCCL's double binary tree, pipelined in chunks: the all-reduce that wins on latency.

The trees are NCCL's (src/graph/trees.cc): tree 0 is a binary tree rooted at rank 0 built
on the ranks' bits, tree 1 mirrors it (even rank counts) or shifts it by one (odd), so a
rank that is interior in one tree is mostly a leaf in the other. Each tree carries half the
buffer: reduce up to the root, broadcast back down. The buffer moves in chunks
(`CHUNK_BYTES`, NCCL's Simple-protocol step: a 4 MiB buffer over 8 steps), so every edge
of both trees, up and down, streams at once once the pipeline is full.

Time, with D the trees' depth, C chunks per flow, a the route latency and b the beat (the
time the busiest link direction takes to carry one chunk of every flow crossing it, from
max-min sharing of all the tree's flows at once) while the pipeline is full:

    T = 2 D (a + b) + (C - 1) b

(steps while it fills and drains are shorter: fewer flows share the links then).

On one switch an interior rank's directions each carry 4 chunk flows of S / 2C, so
b = 2 S / (C B) and T -> 2 D a + 2 S / B for large buffers: within n / (n - 1) of the
ring's bandwidth term, with 2 D latencies instead of the ring's 2 (n - 1).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from chiptrace.emulator.network import Network, Route

CHUNK_BYTES = 512 * 1024


def btree(n: int) -> list[int]:
    """Parent of each rank in NCCL's binary tree over n ranks (-1: the root, rank 0)."""
    parents = [-1]
    for rank in range(1, n):
        bit = 1
        while bit < n and not bit & rank:
            bit <<= 1
        up = (rank ^ bit) | (bit << 1)
        parents.append(up if up < n else rank ^ bit)
    return parents[:n]


def dtree(n: int) -> tuple[list[int], list[int]]:
    """NCCL's two trees: the binary tree, and its mirror (n even) or shift by one (n odd)."""
    t0 = btree(n)
    if n % 2:
        t1 = [-1 if t0[(r - 1) % n] < 0 else (t0[(r - 1) % n] + 1) % n for r in range(n)]
    else:
        t1 = [-1 if t0[n - 1 - r] < 0 else n - 1 - t0[n - 1 - r] for r in range(n)]
    return t0, t1


def depths(parents: Sequence[int]) -> list[int]:
    """Distance of each rank from its tree's root."""
    out: list[int] = []
    for r in range(len(parents)):
        d, p = 0, parents[r]
        while p >= 0:
            d, p = d + 1, parents[p]
        out.append(d)
    return out


def tree_flows(
    net: Network, ranks: Sequence[str], channels: int
) -> tuple[list[Route], np.ndarray, np.ndarray, np.ndarray]:
    """Every flow of both trees: (routes, phase 0 up / 1 down, depth of the edge's child,
    share of the edge's bytes), its channels over each edge's switch planes as
    Network.striped lays them."""
    phase: list[int] = []
    depth: list[int] = []
    edges = [
        (child, parent, dep[child])
        for parents in dtree(len(ranks))
        for dep in [depths(parents)]
        for child, parent in enumerate(parents)
        if parent >= 0
    ]
    pairs: list[tuple[str, str]] = []
    for child, parent, d in edges:
        for ph, (a, b) in ((0, (child, parent)), (1, (parent, child))):
            c = channels or len(net.planes(ranks[a], ranks[b]))
            pairs.append((ranks[a], ranks[b]))
            phase.extend([ph] * c)
            depth.extend([d] * c)
    routes, share = net.striped(pairs, channels)
    return routes, np.array(phase), np.array(depth), share


def pipeline(
    net: Network,
    routes: Sequence[Route],
    phase: np.ndarray,
    depth: np.ndarray,
    per_flow: np.ndarray,
    eff: float = 1.0,
    chunk: float = CHUNK_BYTES,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
    """(dirs, start, end, period) of a pipelined tree's flows, each moving `per_flow`
    bytes in chunks. Chunk step s moves chunk s - o of every flow whose first step is o
    (o = D - depth going up, D + depth - 1 coming down); a step lasts as long as its
    busiest flow takes under max-min sharing among the flows moving in it. While the
    pipeline is full that is the beat b of the module docstring; while it fills and
    drains fewer flows share the links and steps are shorter."""
    dirs = net.dirs_of(routes)
    lat = np.array([r.latency_ns for r in routes], dtype=np.float64)
    chunks = max(1, math.ceil(float(np.max(per_flow)) / chunk))
    piece = np.asarray(per_flow, dtype=np.float64) / chunks
    a, top = float(lat.max()), int(depth.max())
    offset = np.where(phase == 0, top - depth, top + depth - 1)
    last = 2 * top + chunks - 1
    # The moving set changes only where some flow starts or stops: time each stretch once.
    breaks = sorted({0, last, *offset.tolist(), *(offset + chunks).tolist()})
    tau = {0: 0.0}
    for s0, s1 in zip(breaks, breaks[1:], strict=False):
        on = (offset <= s0) & (s0 < offset + chunks)
        beat = float(net.flows(dirs[on], piece[on], np.zeros(int(on.sum())), 0.0, eff).max())
        tau[s1] = tau[s0] + beat * (s1 - s0)
    at = np.vectorize(tau.__getitem__, otypes=[np.float64])
    start = at(offset) + offset * a
    end = at(offset + chunks) + (offset + 1) * a
    return dirs, start, end, tau[last] + 2 * top * a
