"""Topology files and presets: what they declare, and one-line errors for bad ones."""

from __future__ import annotations

import tomllib
from collections import Counter
from pathlib import Path

import pytest

from chiptrace.cli import main
from chiptrace.emulator import PRESETS, TopologyError, build_topology, load_topology
from chiptrace.emulator.network import Network
from chiptrace.schema import CHIP_TYPES, parse_link


def test_rack6_has_all_six_chip_types_and_valid_link_ids():
    topo = load_topology("rack6")
    assert set(Counter(c.type for c in topo.chips.values())) == set(CHIP_TYPES)
    for lk in topo.links:
        parsed = parse_link(lk.id)
        assert (parsed.type, parsed.src, parsed.dst) == (lk.type, lk.src, lk.dst)


def test_nvl72_and_pcie8_shapes():
    nvl = Counter(c.type for c in load_topology("nvl72").chips.values())
    assert (nvl["gpu"], nvl["cpu"], nvl["switch"] >= 18) == (72, 36, True)
    assert nvl["dpu"] and nvl["nic"]
    pcie = load_topology("pcie8")
    assert len(pcie.of_type("gpu")) == 8
    assert not [lk for lk in pcie.links if lk.type.startswith("nvlink")]


def test_presets_have_peaks_and_bandwidths_in_manifest_form():
    for name in PRESETS:
        m = load_topology(name).to_manifest()
        gpus = [c for c in m["chips"] if c["type"] == "gpu"]
        assert gpus and all(
            c["peak_flops"]["bf16"] > 1e14 and c["memory_bandwidth_Bps"] > 1e12 for c in gpus
        )
        assert all(lk["bandwidth_Bps"] > 1e9 and lk["latency_ns"] > 0 for lk in m["links"])


def test_samples_topologies_load():
    root = Path(__file__).resolve().parents[2] / "samples" / "topologies"
    files = sorted(root.glob("*.toml"))
    assert len(files) >= 4
    for f in files:
        assert load_topology(f).chips


def test_routes_go_through_switches_not_gpus():
    topo = load_topology("rack6")
    net = Network(topo)
    r = net.route("gpu:0", "gpu:5")
    assert [net.dir_endpoints(d) for d in r.dirs] == [("gpu:0", "switch:0"), ("switch:0", "gpu:5")]
    assert len(Network(load_topology("nvl72")).planes("gpu:0", "gpu:1")) == 18


@pytest.mark.parametrize(
    ("edit", "needle"),
    [
        (lambda d: d["chip_models"]["G"].update(type="tpu"), "chip_models.G.type = 'tpu'"),
        (lambda d: d["links"][0].update(type="nvlink9"), "links[0].type = 'nvlink9'"),
        (lambda d: d["links"][0].update(b="cpu:7"), "no chip cpu:7"),
        (lambda d: d["links"][0].update(bandwidth_GBps=0), "links[0].bandwidth_GBps = 0"),
        (lambda d: d["links"][0].update(bandwidth_GBps=-3), "links[0].bandwidth_GBps = -3"),
        (lambda d: d["chips"][0].update(model="H9"), "chips[0].model = 'H9'"),
        (lambda d: d["links"][0].update(bandwith_GBps=5), "links[0].bandwith_GBps: unknown key"),
        (
            lambda d: d["chip_models"]["G"].update(memory_gb=5),
            "chip_models.G.memory_gb: unknown key",
        ),
        (lambda d: d["chips"][0].update(count=0), "chips[0].count = 0"),
        (lambda d: d["links"][0].update(connect="mesh"), "links[0].connect = 'mesh'"),
    ],
)
def test_bad_topologies_name_field_and_value(make_tiny, edit, needle):
    data = tomllib.loads(make_tiny())
    edit(data)
    with pytest.raises(TopologyError) as e:
        build_topology(data, "t.toml")
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_no_route_is_an_error(make_tiny):
    data = tomllib.loads(make_tiny())
    data["links"] = data["links"][:1]  # the GPUs no longer reach each other
    net = Network(build_topology(data, "t.toml"))
    with pytest.raises(TopologyError, match="no route from gpu:0 to gpu:1"):
        net.route("gpu:0", "gpu:1")


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--topology", "rack7"], "unknown topology 'rack7'"),
        (["--fault", "slow:gpu:3"], "slow needs a VALUE"),
        (["--fault", "slow:gpu:3:fast"], "VALUE 'fast' is not a number"),
        (["--fault", "down:gpu:3"], "no link 'gpu:3'"),
        (["--fault", "melt:gpu:3:4"], "expected KIND:TARGET[:VALUE]"),
        (["--fault", "degrade:nvlink6:gpu:0-switch:9:0.1"], "no link"),
        (["--fault", "degrade:nvlink6:gpu:0-switch:0:7"], "expected a fraction"),
        (["--precision", "fp7"], "unknown precision 'fp7'"),
        (["--set", "layers=800"], "does not fit"),
        (["--set", "bucket_size=3"], "unknown train workload knob 'bucket_size'"),
        (["--workload", "sing"], "unknown workload 'sing'"),
    ],
)
def test_cli_bad_input_one_line_nonzero(tmp_path, capsys, args, needle):
    rc = main(["emulate", "--out", str(tmp_path / "t"), "--steps", "1", "--no-progress", *args])
    err = capsys.readouterr().err.strip()
    assert rc != 0
    assert needle in err and len(err.splitlines()) == 1, err


def test_cli_bad_topology_file(tmp_path, capsys, make_tiny):
    path = tmp_path / "bad.toml"
    path.write_text(make_tiny("ethernet", -1))
    rc = main(["emulate", "--topology", str(path), "--out", str(tmp_path / "t"), "--steps", "1"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "bandwidth_GBps = -1" in err and str(path) in err


def test_sample_topologies_are_the_presets():
    samples = Path(__file__).parents[2] / "samples" / "topologies"
    for name in PRESETS:
        shipped = load_topology(name)
        copy = load_topology(samples / f"{name}.toml")
        assert copy.to_manifest()["chips"] == shipped.to_manifest()["chips"], name
        assert copy.to_manifest()["links"] == shipped.to_manifest()["links"], name
