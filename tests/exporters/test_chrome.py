"""Chrome Trace Event Format: tracks, strict nesting per track, flows, units, counts."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import pytest

from chiptrace.cli import main
from chiptrace.exporters.chrome import assign_lanes
from tests.exporters.conftest import stored_rows, write_rack_trace


def export_chrome(directory: Path, tmp_path: Path, *extra: str) -> dict:
    out = tmp_path / "trace.chrome.json"
    assert main(["export", str(directory), "--format", "chrome", "-o", str(out), *extra]) == 0
    return json.loads(out.read_text())


def thread_names(doc: dict) -> dict[tuple[int, int], str]:
    return {
        (e["pid"], e["tid"]): e["args"]["name"]
        for e in doc["traceEvents"]
        if e["ph"] == "M" and e["name"] == "thread_name"
    }


def assert_strict_nesting(doc: dict) -> None:
    """On every (pid, tid), slices either nest or do not overlap (integer ns, as Perfetto reads them)."""
    by_track = defaultdict(list)
    for e in doc["traceEvents"]:
        if e["ph"] == "X":
            start = round(e["ts"] * 1000)
            by_track[(e["pid"], e["tid"])].append((start, start + round(e["dur"] * 1000)))
    for track, slices in by_track.items():
        stack: list[int] = []
        for start, end in sorted(slices, key=lambda s: (s[0], -s[1])):
            while stack and stack[-1] <= start:
                stack.pop()
            assert not stack or end <= stack[-1], f"slices overlap without nesting on {track}"
            stack.append(end)


@pytest.fixture
def rack(tmp_path: Path) -> tuple[Path, dict[str, int]]:
    d = tmp_path / "rack"
    return d, write_rack_trace(d)


def test_tracks_per_host_chip_and_link(rack: tuple[Path, dict[str, int]], tmp_path: Path) -> None:
    doc = export_chrome(rack[0], tmp_path)
    assert "displayTimeUnit" not in doc  # ts/dur are microseconds, the format's default
    procs = {e["pid"]: e["args"]["name"] for e in doc["traceEvents"] if e["name"] == "process_name"}
    assert procs == {1: "node1"}
    names = thread_names(doc)
    assert sorted(names.values()) == ["gpu:0", "gpu:0 #2", "gpu:1", "nvlink6:gpu:0-gpu:1"]
    slices = {e["name"]: e for e in doc["traceEvents"] if e["ph"] == "X"}
    assert names[(1, slices["a"]["tid"])] == "gpu:0" == names[(1, slices["c"]["tid"])]
    assert names[(1, slices["b"]["tid"])] == "gpu:0 #2"
    assert names[(1, slices["xfer"]["tid"])] == "nvlink6:gpu:0-gpu:1"
    assert_strict_nesting(doc)


def test_complete_events_in_microseconds_with_args(
    rack: tuple[Path, dict[str, int]], tmp_path: Path
) -> None:
    doc = export_chrome(rack[0], tmp_path)
    rows = {r["name"]: r for r in stored_rows(rack[0])}
    t0 = doc["otherData"]["t0_unix_ns"]
    assert t0 == min(r["start_ns"] for r in rows.values())
    for e in doc["traceEvents"]:
        if e["ph"] != "X":
            continue
        r = rows[e["name"]]
        assert round(e["ts"] * 1000) == r["start_ns"] - t0
        assert round(e["dur"] * 1000) == r["end_ns"] - r["start_ns"]
        assert e["args"]["span_id"] == r["span_id"].hex()
        assert e["cat"] == r["op_kind"]
    xfer = next(e for e in doc["traceEvents"] if e["name"] == "xfer")
    assert xfer["args"]["op.bytes"] == 1 << 30 and xfer["args"]["link.type"] == "nvlink6"


def test_flows_from_transfer_to_the_ops_it_feeds(
    rack: tuple[Path, dict[str, int]], tmp_path: Path
) -> None:
    doc = export_chrome(rack[0], tmp_path)
    slices = {e["name"]: e for e in doc["traceEvents"] if e["ph"] == "X"}
    starts = {e["id"]: e for e in doc["traceEvents"] if e["ph"] == "s"}
    ends = {e["id"]: e for e in doc["traceEvents"] if e["ph"] == "f"}
    assert starts.keys() == ends.keys() and len(starts) == 2
    fed = set()
    for fid, s in starts.items():
        f = ends[fid]
        src = slices["xfer"]
        assert (s["pid"], s["tid"]) == (src["pid"], src["tid"])
        assert src["ts"] <= s["ts"] <= src["ts"] + src["dur"]  # bound inside the transfer
        dst = next(x for x in slices.values() if (x["tid"], x["ts"]) == (f["tid"], f["ts"]))
        assert f["bp"] == "e"
        fed.add(dst["name"])
    assert fed == {"d", "e"}


def test_round_trip_span_count_and_nesting_on_code_trace(code_trace: Path, tmp_path: Path) -> None:
    doc = export_chrome(code_trace, tmp_path)
    xs = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    assert len(xs) == doc["otherData"]["spans"] == 11
    assert {e["args"]["span_id"] for e in xs} == {
        r["span_id"].hex() for r in stored_rows(code_trace)
    }
    procs = {e["args"]["name"] for e in doc["traceEvents"] if e["name"] == "process_name"}
    assert "node2" in procs and len(procs) == 2
    assert_strict_nesting(doc)


def test_lanes_nest_strictly() -> None:
    # a contains c; b overlaps a; d fits after a on lane 0; e overlaps b and d.
    spans = [(0, 100, 1), (10, 20, 2), (50, 150, 3), (100, 130, 4), (120, 160, 5)]
    lanes = assign_lanes(spans)
    assert lanes[1] == lanes[2] == lanes[4] == 0
    assert lanes[3] == 1 and lanes[5] == 2
