"""The link model checks of issue 3: latency + bytes/bandwidth, sharing, collectives."""

from __future__ import annotations

import tomllib

import pytest

from chiptrace.emulator import build_topology, load_topology
from chiptrace.emulator import collectives as coll
from chiptrace.emulator.network import Network


@pytest.fixture
def net_of(make_tiny):
    def build(ltype: str, bw: float) -> Network:
        return Network(build_topology(tomllib.loads(make_tiny(ltype, bw)), "t"))

    return build


def test_100mb_over_one_pcie4_hop(net_of):
    net = net_of("pcie4", 32)
    r = net.route("cpu:0", "gpu:0")
    assert len(r.dirs) == 1
    assert net.fluid([0.0], [r], [100e6])[0] == pytest.approx(3127.5e3)  # ns


def test_100mb_over_nvlink6(net_of):
    net = net_of("nvlink6", 1800)
    end = net.fluid([0.0], [net.route("cpu:0", "gpu:0")], [100e6])[0]
    assert end / 1e3 == pytest.approx(58.06, abs=0.05)


def test_two_transfers_share_a_direction_but_not_opposite_ones(net_of):
    net = net_of("pcie4", 32)
    fwd, back = net.route("cpu:0", "gpu:0"), net.route("gpu:0", "cpu:0")
    alone = net.fluid([0.0], [fwd], [1e9])[0]
    same = net.fluid([0.0, 0.0], [fwd, fwd], [1e9, 1e9])
    opposite = net.fluid([0.0, 0.0], [fwd, back], [1e9, 1e9])
    assert same == pytest.approx([2 * alone - 2500] * 2, rel=1e-6)  # latency is not shared
    assert opposite == pytest.approx([alone] * 2)


def test_late_arrival_gets_a_share_then_the_whole_link(net_of):
    net = net_of("pcie4", 32)
    r = net.route("cpu:0", "gpu:0")
    a, b = net.fluid([0.0, 0.0 + 15.625e6], [r, r], [1e9, 1e9])  # b starts halfway through a
    assert a == pytest.approx(2500 + 31.25e6 + 15.625e6, rel=1e-6)
    assert b > a


@pytest.mark.parametrize("nbytes", [1e6, 256e6, 4e9])
def test_ring_allreduce_matches_the_formula(nbytes):
    topo = load_topology("rack6")
    net = Network(topo)
    gpus = topo.of_type("gpu")
    n, a = len(gpus), net.route("gpu:0", "gpu:1").latency_ns
    bw = topo.links[topo.link_index("nvlink6:gpu:0-switch:0")].bandwidth
    want = 2 * (n - 1) * a + 2 * (n - 1) / n * nbytes / bw * 1e9
    got = coll.plan(net, "ring", gpus, nbytes).duration_ns
    assert got == pytest.approx(want, rel=0.02)


def test_tree_allreduce_is_latency_cheaper_for_small_buffers_on_many_ranks():
    topo = load_topology("nvl72")
    net = Network(topo)
    gpus = topo.of_type("gpu")
    small = {a: coll.plan(net, a, gpus, 64e3).duration_ns for a in ("ring", "tree")}
    assert small["tree"] < small["ring"] / 5  # 2 log2(n) latencies against 2(n-1)


@pytest.mark.parametrize(("nbytes", "winner"), [(64e3, "tree"), (8e6, "tree"), (1.29e9, "ring")])
def test_tree_against_ring_by_size_and_auto_picks_the_faster(nbytes, winner):
    topo = load_topology("rack6")
    net = Network(topo)
    gpus = topo.of_type("gpu")
    t = {a: coll.plan(net, a, gpus, nbytes).duration_ns for a in ("ring", "tree")}
    assert min(t, key=t.get) == winner
    assert coll.plan(net, "auto", gpus, nbytes).name == f"allreduce.{winner}"
    if winner == "ring":  # pipelined: close to the ring's bandwidth, not log2(n) times off
        assert t["tree"] < 1.15 * t["ring"]


def test_sharing_happens_on_the_hop_two_routes_have_in_common():
    net = Network(load_topology("pcie8"))
    a, b = net.route("gpu:0", "gpu:4"), net.route("gpu:1", "gpu:5")
    assert len(a.dirs) == 4 and set(a.dirs) & set(
        b.dirs
    )  # both cross switch:0 -> cpu:0 -> switch:1
    alone = net.fluid([0.0], [a], [1e9])[0]
    both = net.fluid([0.0, 0.0], [a, b], [1e9, 1e9])
    assert alone == pytest.approx(4 * 2500 + 1e9 / 32e9 * 1e9)
    assert both == pytest.approx([4 * 2500 + 2 * 1e9 / 32e9 * 1e9] * 2)
    inside = net.fluid([0.0, 0.0], [a, net.route("gpu:1", "gpu:2")], [1e9, 1e9])
    assert inside == pytest.approx([alone, 2 * 2500 + 1e9 / 32e9 * 1e9])  # disjoint: no sharing
