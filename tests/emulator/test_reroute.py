"""One downed link on a switched fabric: only the flows that crossed it reroute (issue 23).

Property-style: a few downed GPU-switch links drawn at random (a fixed seed per case) on
nvl72's 18 planes and on a small 4-plane rack; every collective keeps every other link of
every plane busy, and the bytes the links carry are conserved.
"""

from __future__ import annotations

import random
import tomllib
from collections import defaultdict

import pytest

from chiptrace.emulator import build_topology, load_topology
from chiptrace.emulator import collectives as coll
from chiptrace.emulator.faults import apply_faults, parse_fault
from chiptrace.emulator.network import Network
from chiptrace.emulator.topology_files import Topology
from chiptrace.query import connect

PLANES4 = """
name = "planes4"
[chip_models.G]
type = "gpu"
peak_tflops = { bf16 = 100 }
memory_GB = 80
memory_bandwidth_GBps = 2000
[[chips]]
model = "G"
count = 6
[[chips]]
type = "switch"
count = 4
""" + "".join(
    f'[[links]]\ntype = "nvlink5"\na = "gpu:*"\nb = "switch:{s}"\nbandwidth_GBps = 900\n'
    for s in range(4)
)


def _topologies() -> dict[str, Topology]:
    return {
        "nvl72": load_topology("nvl72"),
        "planes4": build_topology(tomllib.loads(PLANES4), "planes4"),
    }


def _link_bytes(net: Network, p: coll.Plan) -> dict[str, float]:
    """Bytes each link carries (both directions) over plan p."""
    out: dict[str, float] = defaultdict(float)
    for r in p.rounds:
        for flow, nb in zip(r.dirs, r.nbytes, strict=True):
            for d in flow[flow >= 0]:
                out[net.topology.links[int(d) // 2].id] += float(nb) * r.repeat
    return out


def _plans(net: Network, gpus: list[str]) -> dict[str, coll.Plan]:
    return {
        "ring": coll.plan(net, "ring", gpus, 64e6),
        "tree": coll.plan(net, "tree", gpus, 64e6),
        "alltoall": coll.alltoall(net, gpus, 64e6),
    }


def _cases() -> list[tuple[str, int]]:
    return [("nvl72", seed) for seed in (1, 2)] + [("planes4", seed) for seed in (3, 4, 5)]


@pytest.mark.parametrize(("name", "seed"), _cases())
def test_a_downed_link_moves_only_its_own_flows(name, seed):
    topo = _topologies()[name]
    rng = random.Random(seed)
    gpu_links = [lk.id for lk in topo.links if lk.src.startswith("gpu:")]
    down = rng.choice(gpu_links[1:])  # never the first, as the fault matrix draws
    effects = apply_faults(topo, [parse_fault(f"down:{down}", topo)])
    healthy = Network(topo)
    faulted = Network(effects.topology, effects.bandwidth, [down])
    gpus = topo.of_type("gpu")
    for kind, plan in _plans(faulted, gpus).items():
        before = _link_bytes(healthy, _plans(healthy, gpus)[kind])
        after = _link_bytes(faulted, plan)
        assert down not in after
        idle = sorted(lk for lk in before if lk != down and after.get(lk, 0.0) <= 0)
        assert idle == [], f"{kind} on {name} without {down}: links left idle {idle[:5]}"
        assert sum(after.values()) == pytest.approx(sum(before.values()), rel=1e-9), kind
        # Links of GPUs that exchange nothing with the downed link's GPU carry what they did.
        peers = _peers(healthy, _plans(healthy, gpus)[kind], down.split(":", 1)[1].split("-")[0])
        kept = [lk for lk in before if not any(f"{g}-" in lk for g in peers)]
        assert kept or kind == "alltoall" or name == "planes4"
        assert all(after[lk] == pytest.approx(before[lk], rel=1e-9) for lk in kept), kind


def _peers(net: Network, p: coll.Plan, gpu: str) -> set[str]:
    """`gpu` and every chip that sends to it or receives from it in plan p."""
    out = {gpu}
    for r in p.rounds:
        for flow in r.dirs:
            hops = flow[flow >= 0]
            ends = (net.dir_endpoints(int(hops[0]))[0], net.dir_endpoints(int(hops[-1]))[1])
            if gpu in ends:
                out.update(ends)
    return out


def test_nvl72_train_with_one_nvlink_down_keeps_every_plane(tmp_path):
    from chiptrace.emulator import emulate

    down = "nvlink5:gpu:54-switch:11"
    r = emulate(
        topology="nvl72",
        steps=1,
        seed=1,
        out=tmp_path / "t",
        faults=[f"down:{down}"],
        progress=False,
    )
    rows = (
        connect(r.out)
        .sql(
            "SELECT regexp_extract(link_id, 'switch:[0-9]+') AS sw, count(DISTINCT link_id), "
            "sum(op_bytes) FROM spans WHERE link_id LIKE '%switch:%' GROUP BY 1"
        )
        .fetchall()
    )
    per_plane = {sw: (links, float(nb)) for sw, links, nb in rows}
    assert len(per_plane) == 18
    full = [nb for sw, (links, nb) in per_plane.items() if sw != "switch:11"]
    assert all(per_plane[sw][0] == 72 for sw in per_plane if sw != "switch:11")
    assert per_plane["switch:11"][0] == 71
    assert max(full) == pytest.approx(min(full), rel=1e-6)
    # The plane that lost a link carries all but that link's share (1/72 of the plane).
    assert per_plane["switch:11"][1] == pytest.approx(full[0] * 71 / 72, rel=0.02)


def _plane_bytes(out) -> tuple[dict[str, tuple[int, float]], dict[str, float]]:
    """Per NVLink plane (switch): (links that carried bytes, bytes); per link: bytes."""
    per_link = dict(
        connect(out)
        .sql(
            "SELECT link_id, sum(op_bytes)::DOUBLE FROM spans WHERE link_id LIKE '%switch:%' GROUP BY 1"
        )
        .fetchall()
    )
    planes: dict[str, list[float]] = defaultdict(list)
    for lk, nb in per_link.items():
        planes[lk.rsplit("-", 1)[1]].append(nb)
    return {sw: (len(v), sum(v)) for sw, v in planes.items()}, per_link


@pytest.fixture(scope="module")
def nvl72_healthy(tmp_path_factory):
    from chiptrace.emulator import emulate

    out = tmp_path_factory.mktemp("nvl72") / "healthy"
    return _plane_bytes(emulate(topology="nvl72", steps=1, seed=1, out=out, progress=False).out)


@pytest.mark.parametrize("seed", [1, 2])
def test_nvl72_train_with_several_random_nvlinks_down_keeps_every_plane(
    tmp_path, seed, nvl72_healthy
):
    """Three GPU-switch links drawn at random (seed 2: two of them one GPU's): each plane
    keeps every link it has left busy, a plane that lost k links carries nearly as much per
    link as before, the planes that lost none carry equal bytes, and every GPU still moves
    the bytes it moved before (over its remaining planes)."""
    from chiptrace.emulator import emulate

    topo = load_topology("nvl72")
    rng = random.Random(seed)
    links = [lk.id for lk in topo.links if lk.src.startswith("gpu:") and "switch" in lk.dst]
    down = rng.sample(links[1:], 3)
    if seed == 2:  # two planes of one GPU
        gpu = down[0].split(":", 1)[1].split("-")[0]
        down[1] = rng.choice([lk for lk in links if f":{gpu}-" in lk and lk != down[0]])
    r = emulate(
        topology="nvl72",
        steps=1,
        seed=1,
        out=tmp_path / "t",
        faults=[f"down:{d}" for d in down],
        progress=False,
    )
    planes, per_link = _plane_bytes(r.out)
    healthy, healthy_link = nvl72_healthy
    assert len(planes) == 18 and not set(down) & set(per_link)
    lost = {sw: sum(d.endswith(f"-{sw}") for d in down) for sw in planes}
    assert {sw: n for sw, (n, _) in planes.items()} == {sw: 72 - k for sw, k in lost.items()}
    full = [nb for sw, (_, nb) in planes.items() if not lost[sw]]
    assert max(full) == pytest.approx(min(full), rel=1e-9)
    per_healthy_link = healthy["switch:0"][1] / 72
    for sw, (n, nb) in planes.items():
        assert nb / n >= 0.9 * per_healthy_link, (sw, n, nb, per_healthy_link)
    assert sum(nb for _, nb in planes.values()) == pytest.approx(
        sum(nb for _, nb in healthy.values()), rel=1e-6
    )
    for d in down:  # the GPU's traffic moved to its other planes, none of it lost
        gpu = d.split(":", 1)[1].split("-")[0]
        mine = [lk for lk in healthy_link if f":{gpu}-" in lk]
        now = sum(per_link.get(lk, 0.0) for lk in mine)
        assert now == pytest.approx(sum(healthy_link[lk] for lk in mine), rel=1e-6), d
