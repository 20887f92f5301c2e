"""Exports of an emulated rack's trace: OTLP to a receiver process, Jaeger and Chrome files."""

from __future__ import annotations

from pathlib import Path

import pytest

from chiptrace.cli import main
from chiptrace.importers.jaeger import read_jaeger_json
from tests.exporters.conftest import Receiver, stored_rows
from tests.exporters.test_chrome import assert_strict_nesting, export_chrome, thread_names
from tests.exporters.test_otlp import assert_received_as_stored

emulator = pytest.importorskip("chiptrace.emulator")


@pytest.fixture(scope="module")
def emulated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("emu") / "trace"
    emulator.emulate(topology="rack6", workload="train", steps=2, seed=3, out=out, progress=False)
    return out


@pytest.mark.parametrize("proto", ["http", "grpc"])
def test_every_emulated_span_arrives_exactly(
    emulated: Path, receiver: Receiver, proto: str
) -> None:
    url = receiver.http_url if proto == "http" else receiver.grpc_url
    assert main(["export", str(emulated), "--otlp", url, "--batch-size", "500"]) == 0
    n = assert_received_as_stored(receiver, emulated)
    assert n > 1000
    assert any(sp.links for _, _, sp in receiver.spans())


def test_jaeger_file_round_trip(emulated: Path, tmp_path: Path) -> None:
    out = tmp_path / "emu.json"
    assert main(["export", str(emulated), "-f", "jaeger-json", "-o", str(out)]) == 0
    back = read_jaeger_json(out)
    rows = stored_rows(emulated)
    assert back.spans == len(rows) and back.warnings == []
    assert len(back.traces) == len({r["trace_id"] for r in rows})
    refs = {ref["refType"] for t in back.traces for s in t["spans"] for ref in s["references"]}
    assert refs == {"CHILD_OF", "FOLLOWS_FROM"}


def test_chrome_file_tracks_nesting_and_flows(emulated: Path, tmp_path: Path) -> None:
    doc = export_chrome(emulated, tmp_path)
    rows = stored_rows(emulated)
    xs = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    assert len(xs) == len(rows)
    assert_strict_nesting(doc)
    names = set(thread_names(doc).values())
    chips = {r["chip_id"] for r in rows if r["chip_id"]}
    links = {r["link_id"] for r in rows if r["link_id"]}
    assert chips | links <= {n.split(" #")[0] for n in names}
    flows = [e for e in doc["traceEvents"] if e["ph"] in ("s", "f")]
    assert flows and len(flows) % 2 == 0
