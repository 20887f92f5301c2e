"""A downed link that was the only path to a chip (issue 23): the chip is lost, as a GPU whose
C2C or PCIe link fails falls off its host's bus. The run goes on without it, its link state
says so (`chips_lost`), and the report names the link with what it cost; a degraded link
is never reported down; where no CPU sees the chips, a missing route is a one-line error."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from chiptrace.emulator import TopologyError, WorkloadError, emulate, load_topology
from chiptrace.emulator.faults import link_state, lost_chips, parse_fault
from chiptrace.query import connect


@pytest.mark.parametrize(
    ("topology", "link", "lost"),
    [
        ("rack6", "c2c:gpu:6-cpu:1", ["gpu:6"]),
        ("rack6", "pcie5:npu:1-cpu:1", ["npu:1"]),
        ("pcie8", "pcie4:gpu:4-switch:1", ["gpu:4"]),
        ("pcie8", "pcie4:nic:0-cpu:0", ["nic:0"]),  # its only NIC
        ("rack6", "nvlink6:gpu:2-switch:0", []),  # C2C and the CPUs still reach it
        ("rack6", "pcie5:nic:0-cpu:0", []),  # through switch:1 and the other NIC
        ("nvl72", "nvlink5:gpu:54-switch:11", []),  # 17 planes left
    ],
)
def test_a_chip_is_lost_only_when_the_link_was_its_only_path(topology, link, lost):
    assert lost_chips(load_topology(topology), [link]) == ({link: lost} if lost else {})


def test_a_switch_uplink_loses_every_chip_behind_it():
    topo = load_topology("pcie8")
    behind = [n for n, _ in topo.adjacency["switch:0"] if n != "cpu:0"]
    got = lost_chips(topo, ["pcie4:switch:0-cpu:0"])["pcie4:switch:0-cpu:0"]
    assert set(got) == set(behind) and {c.split(":")[0] for c in got} >= {"gpu"}


def test_a_chip_cut_off_by_two_links_together_is_listed_under_both():
    # rack6's nic:0 reaches its CPU directly or over Ethernet through the other NIC
    both = ["pcie5:nic:0-cpu:0", "ethernet:nic:0-switch:1"]
    rack6 = load_topology("rack6")
    assert [lost_chips(rack6, [d]) for d in both] == [{}, {}]
    assert lost_chips(rack6, both) == dict.fromkeys(both, ["nic:0"])


def test_link_state_says_down_with_the_chips_lost_and_degraded_is_up():
    topo = load_topology("rack6")
    faults = [parse_fault(f, topo) for f in ("down:c2c:gpu:6-cpu:1", "degrade:c2c:gpu:5-cpu:1:0.2")]
    state = link_state(faults, lost_chips(topo, ["c2c:gpu:6-cpu:1"]))
    assert state == [
        {"link": "c2c:gpu:6-cpu:1", "state": "down", "chips_lost": ["gpu:6"]},
        {"link": "c2c:gpu:5-cpu:1", "state": "up", "bandwidth_fraction": 0.2},
    ]


def test_training_runs_without_the_lost_gpu_and_the_report_says_link_down(tmp_path):
    from chiptrace.analysis import TraceAnalysis

    link = "c2c:gpu:6-cpu:1"
    r = emulate(steps=2, seed=3, out=tmp_path / "t", faults=[f"down:{link}"], progress=False)
    con = connect(r.out)
    rows = con.sql("SELECT DISTINCT chip_id FROM spans WHERE chip_type = 'gpu'").fetchall()
    gpus = {c for (c,) in rows}
    assert gpus == {f"gpu:{i}" for i in range(8)} - {"gpu:6"}
    ((moved,),) = con.sql("SELECT count(*) FROM spans WHERE link_id LIKE '%gpu:6-%'").fetchall()
    assert moved == 0
    manifest = json.loads(next((r.out / "manifest").glob("*.json")).read_text())
    assert manifest["link_state"] == [{"link": link, "state": "down", "chips_lost": ["gpu:6"]}]
    found = TraceAnalysis(r.out).findings()
    top = found[0]
    assert (top.rule, top.culprit, top.severity) == ("link-down", link, "high"), found[:3]
    assert top.evidence["chips_lost"] == ["gpu:6"] and top.evidence["of_chips"] == 8
    step = top.saving_ns / top.share
    assert top.saving_ns == pytest.approx(step / 8, rel=1e-6)  # one GPU of eight's work
    assert "only path to gpu:6" in top.suggestion


LINK = """[[links]]
type = "nvlink5"
a = "gpu:*"
b = "switch:0"
bandwidth_GBps = 900
"""
TWO_GPUS = (
    """
name = "two"
[chip_models.G]
type = "gpu"
peak_tflops = { bf16 = 2000 }
memory_GB = 180
memory_bandwidth_GBps = 8000
[chip_models.D]
type = "dpu"
peak_tflops = { fp32 = 1 }
memory_GB = 32
memory_bandwidth_GBps = 80
[[chips]]
model = "G"
count = 2
[[chips]]
type = "switch"
[[chips]]
type = "dpu"
model = "D"
[[links]]
type = "pcie5"
a = "dpu:0"
b = "switch:0"
bandwidth_GBps = 64
"""
    + LINK
)


def test_without_cpus_a_missing_route_is_a_one_line_user_error(tmp_path):
    path = tmp_path / "two.toml"
    path.write_text(TWO_GPUS)
    with pytest.raises(
        TopologyError, match=r"no route from dpu:0 to gpu:1 .*links down: nvlink5:gpu:1"
    ):
        emulate(str(path), steps=1, out=tmp_path / "a", faults=["down:nvlink5:gpu:1-switch:0"])
    bare = tmp_path / "bare.toml"
    bare.write_text(TWO_GPUS.split('[[chips]]\ntype = "dpu"')[0] + LINK)
    with pytest.raises(WorkloadError, match="no DPU or CPU to feed the GPUs"):
        emulate(str(bare), steps=1, out=tmp_path / "c")
    cli = [sys.executable, "-m", "chiptrace", "emulate", "--topology", str(path), "--steps", "1"]
    cli += ["--out", str(tmp_path / "b"), "--fault", "down:nvlink5:gpu:1-switch:0", "--no-progress"]
    p = subprocess.run(cli, capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and p.stdout == ""
    cli = [sys.executable, "-m", "chiptrace", "emulate", "--topology", "pcie8", "--steps", "1"]
    cli += ["--out", str(tmp_path / "d"), "--fault", "down:pcie4:gpu:4-switch:1", "--no-progress"]
    lost = subprocess.run(cli, capture_output=True, text=True, timeout=120)
    assert lost.returncode == 0, lost.stderr
    assert "pcie4:gpu:4-switch:1 was the only path to gpu:4: the run went on" in lost.stdout
    assert p.stderr.count("\n") == 1 and "no route from" in p.stderr, p.stderr
    assert "Traceback" not in p.stderr


def test_a_lost_host_chip_is_named_without_a_saving_the_trace_cannot_show(tmp_path):
    # pcie8's one NIC off its CPU: training (no input over the network) does not miss it,
    # and the report names it without claiming a share of the step's work.
    from chiptrace.analysis import TraceAnalysis

    link = "pcie4:nic:0-cpu:0"
    r = emulate("pcie8", steps=2, seed=3, out=tmp_path / "t", faults=[f"down:{link}"])
    (f,) = [f for f in TraceAnalysis(r.out).findings() if f.rule == "link-down"]
    assert (f.culprit, f.evidence["chips_lost"], f.saving_ns) == (link, ["nic:0"], 0.0)
    assert f.evidence["cost_ms_per_step"] == "unknown: a host chip"


@pytest.mark.parametrize(
    ("topology", "faults"),
    [
        ("pcie8", ["down:pcie4:gpu:5-switch:1", "down:pcie4:dpu:0-cpu:0"]),
        ("h100x8", []),  # no DPU: each CPU is its own input host (a copy with no hop)
        ("h100x8", ["down:pcie5:switch:1-cpu:0"]),
    ],
)
def test_mixed_runs_on_what_is_left(tmp_path, topology, faults):
    r = emulate(topology, "mixed", steps=1, seed=1, out=tmp_path / "m", faults=faults)
    assert r.spans > 0 and r.stored == r.spans
