"""One topology model and one manifest reader: the emulator writes it, the report and the
dashboard read it back the same way."""

from __future__ import annotations

import json

import pytest

from chiptrace.emulator import load_topology
from chiptrace.topology import merge_topologies, parse_topology
from chiptrace.viewer.live_model import LiveModel

# Spellings older writers used: a JSON string, a table by id, gigabit and microsecond keys,
# a link without a type, an entry without an id (skipped).
ODD = {
    "topology": json.dumps(
        {
            "chips": {
                "host/gpu:0": {"model": "B200", "peak_tflops": {"bf16": 2000}},
                "gpu:1": {"chip_type": "gpu", "mem_bw_GBps": 8000},
                "switch:0": {},
            },
            "links": [
                {
                    "id": "nvlink5:gpu:1-switch:0",
                    "src": "gpu:1",
                    "dst": "switch:0",
                    "bandwidth_GBps": 900,
                    "latency_us": 2.5,
                },
                {"link_id": "pcie5:gpu:0-switch:0", "bandwidth_gbps": 512},
                {"type": "pcie5", "bandwidth_Bps": 1},
            ],
        }
    )
}


def _viewer_view(manifest: dict) -> tuple[dict, dict]:
    model = LiveModel()
    model.declare([manifest])
    chips = {k: model.chips.meta[r]["type"] for k, r in model.chips.keys.items()}
    links = {k: model.links.meta[r] for k, r in model.links.keys.items()}
    return chips, links


def _report_view(manifest: dict) -> tuple[dict, dict]:
    topo = merge_topologies([manifest])  # what analysis.tables builds the report from
    chips = {c.id: c.type for c in topo.chips.values()}
    links = {
        lk.id: {
            "type": lk.type,
            "src": lk.src or None,
            "dst": lk.dst or None,
            "bandwidth": topo.bandwidth(lk.id),
        }
        for lk in topo.links
    }
    return chips, links


@pytest.mark.parametrize("manifest", [ODD, {"topology": load_topology("rack6").to_manifest()}])
def test_report_and_dashboard_read_one_manifest_alike(manifest: dict) -> None:
    assert _viewer_view(manifest) == _report_view(manifest)


def test_odd_spellings_in_base_units() -> None:
    topo = parse_topology(ODD)
    assert topo.peak("host/gpu:0", "fp16") == 2e15  # bf16 stands in for fp16
    assert topo.model("host/gpu:0") == "B200" and topo.model("gpu:1") is None
    assert topo.chips["host/gpu:0"].type == "gpu"
    assert topo.chips["gpu:1"].memory_bandwidth == 8e12
    assert topo.bandwidth("nvlink5:gpu:1-switch:0") == 900e9
    assert topo.link("nvlink5:gpu:1-switch:0").latency_ns == 2500  # type: ignore[union-attr]
    assert topo.bandwidth("pcie5:gpu:0-switch:0") == 64e9
    assert topo.link("pcie5:gpu:0-switch:0").type == "pcie5"  # type: ignore[union-attr]
    assert len(topo.links) == 2
    assert parse_topology({"topology": "{not json"}).known is False


def test_emulator_topology_round_trips_through_its_manifest() -> None:
    topo = load_topology("h100x8")
    back = parse_topology({"topology": topo.to_manifest()})
    assert back.chips == topo.chips
    assert back.links == topo.links
    assert back.adjacency == topo.adjacency
    assert (back.name, back.source) == (topo.name, topo.source)


def test_sql_topology_links_view_reads_links_as_parse_topology_does(tmp_path) -> None:
    import chiptrace
    from tests.analysis.analysis_helpers import TraceBuilder

    links = json.loads(ODD["topology"])["links"] + [
        {"name": "ethernet:nic:0-switch:0", "bandwidth_bps": 400e9, "latency": 2e-6}
    ]
    manifest = {"topology": {"links": links}}
    b = TraceBuilder()
    b.span("x", 0, 1, trace=b.new_trace(), chip="gpu:0")
    con = chiptrace.connect(b.write(tmp_path / "t", manifest))
    got = {
        r[0]: r[1:]
        for r in con.sql(
            "SELECT link_id, link_type, bandwidth_Bps, latency_ns FROM topology_links"
        ).fetchall()
    }
    topo = parse_topology(manifest)
    want = {lk.id: (lk.type, lk.bandwidth or None, lk.latency_ns or None) for lk in topo.links}
    assert got == want  # the same double arithmetic on both sides
    assert len(got) == 3 and got["ethernet:nic:0-switch:0"][1] == 50e9
