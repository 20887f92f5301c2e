"""NCCL-like collectives (issue 17, item 3): each within 5% of its analytic formula on one
switch, the ring exact, the pipelined tree close to ring bandwidth, auto picks the faster."""

from __future__ import annotations

import numpy as np
import pytest

from chiptrace.emulator import collectives as coll
from chiptrace.emulator import load_topology, trees
from chiptrace.emulator.network import Network

S = 1.29e9  # a large gradient bucket


@pytest.fixture(scope="module")
def rack6():
    topo = load_topology("rack6")  # 8 GPUs on one NVLink 6 switch
    net = Network(topo)
    gpus = topo.of_type("gpu")
    return net, gpus, net.route(gpus[0], gpus[1]).latency_ns, 1.8e12


@pytest.mark.parametrize("n", [4, 8])
def test_ring_allreduce_is_exact_on_one_switch(rack6, n):
    net, gpus, a, bw = rack6
    for nbytes in (1e6, S):
        want = 2 * (n - 1) * a + 2 * (n - 1) / n * nbytes / bw * 1e9
        assert coll.plan(net, "ring", gpus[:n], nbytes).duration_ns == pytest.approx(want, rel=3e-5)


def test_ring_allreduce_on_72_ranks_striped_over_18_planes():
    topo = load_topology("nvl72")
    net = Network(topo)
    gpus = topo.of_type("gpu")
    a = net.route(gpus[0], gpus[1]).latency_ns
    want = 2 * 71 * a + 2 * 71 / 72 * S / 900e9 * 1e9
    assert coll.plan(net, "ring", gpus, S).duration_ns == pytest.approx(want, rel=3e-5)


@pytest.mark.parametrize(
    ("fn", "name", "steps"),
    [(coll.allgather, "allgather.ring", 7), (coll.reducescatter, "reducescatter.ring", 7)],
)
def test_allgather_and_reducescatter_match_their_formula(rack6, fn, name, steps):
    net, gpus, a, bw = rack6
    p = fn(net, gpus, S)
    assert p.name == name
    want = steps * a + steps / 8 * S / bw * 1e9
    assert p.duration_ns == pytest.approx(want, rel=0.05)


@pytest.mark.parametrize("topology", ["rack6", "nvl72"])
def test_alltoall_matches_its_formula_and_spreads_over_planes(topology):
    topo = load_topology(topology)
    net = Network(topo)
    gpus = topo.of_type("gpu")[:8]
    a = net.route(gpus[0], gpus[1]).latency_ns
    bw = {"rack6": 1.8e12, "nvl72": 900e9}[topology]  # per GPU, per direction
    p = coll.alltoall(net, gpus, S)
    assert p.duration_ns == pytest.approx(a + 7 / 8 * S / bw * 1e9, rel=0.05)
    assert (p.rounds[0].dirs >= 0).sum() == len(p.rounds[0].nbytes) * 2  # two hops a flow


def test_double_binary_trees_are_nccls():
    # NCCL's src/graph/trees.cc: 0-8 root, 8's children 4 and 12, ... (13 ranks: shifted)
    t0, t1 = trees.dtree(14)
    assert t0[8] == 0 and t0[4] == 8 and t0[12] == 8 and t0[13] == 12 and t0[0] == -1
    assert t1 == [-1 if u < 0 else 13 - u for u in (t0[13 - r] for r in range(14))]
    t0, t1 = trees.dtree(13)
    assert t1[1] == -1 and t1[9] == 1  # the shifted tree's root is rank 1
    assert max(trees.depths(t0)) == 4  # 1 -> 2 -> 4 -> 8 -> 0


def test_pipelined_tree_is_within_5_percent_of_its_formula(rack6):
    net, gpus, a, bw = rack6
    depth = max(trees.depths(trees.btree(8)))  # 3
    chunks = np.ceil(S / 2 / trees.CHUNK_BYTES)
    want = 2 * depth * a + 2 * S / bw * 1e9 * (1 + (2 * depth - 1) / chunks)
    assert coll.plan(net, "tree", gpus, S).duration_ns == pytest.approx(want, rel=0.05)


def test_collective_kernels_reach_a_fraction_of_the_link(rack6):
    net, gpus, a, bw = rack6
    full = coll.plan(net, "ring", gpus, S).duration_ns
    slowed = coll.plan(net, "ring", gpus, S, eff=0.8).duration_ns
    assert slowed - 14 * a == pytest.approx((full - 14 * a) / 0.8, rel=1e-6)
