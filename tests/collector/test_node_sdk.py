"""Spans from the real OpenTelemetry JS SDK (Node.js) reach the store: HTTP/protobuf, which
the SDK sends chunked, with and without gzip, and gRPC.

The pinned packages (tests/clients/node-otel/package.json) are `npm install`ed once into a
cache folder (~/.cache/chiptrace-tests, or $CHIPTRACE_TEST_CACHE) named by the
package.json's hash, and reused by later runs; the test skips, saying why, when node or
npm is missing or the install fails.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from chiptrace._attributes import attributes as span_attributes
from tests.collector.test_collect import Collector, stored

HERE = Path(__file__).resolve().parent
PACKAGE = HERE.parent / "clients" / "node-otel" / "package.json"
SENDER = HERE / "node_sender.mjs"


@pytest.fixture(scope="module")
def node_client() -> Path:
    """A folder holding the installed JS SDK and the sender script."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if not node or not npm:
        pytest.skip("the Node.js client test needs node and npm on PATH")
    cache = Path(os.environ.get("CHIPTRACE_TEST_CACHE", Path.home() / ".cache" / "chiptrace-tests"))
    digest = hashlib.sha256(PACKAGE.read_bytes()).hexdigest()[:12]
    folder = cache / f"node-otel-{digest}"
    if not (folder / "node_modules").is_dir():
        # Installed beside, then renamed into place: runs sharing the cache never see half.
        tmp = cache / f".node-otel-{digest}-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        shutil.copy(PACKAGE, tmp / "package.json")
        proc = subprocess.run(
            [npm, "install", "--no-audit", "--no-fund", "--loglevel=error"],
            cwd=tmp,
            capture_output=True,
            text=True,
            timeout=300,
        )
        if proc.returncode:
            shutil.rmtree(tmp, ignore_errors=True)
            last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
            pytest.skip(f"npm install of the OpenTelemetry JS SDK failed: {last}")
        try:
            tmp.rename(folder)
        except OSError:  # another run installed it first
            shutil.rmtree(tmp, ignore_errors=True)
    shutil.copy(SENDER, folder / SENDER.name)
    return folder


def send(folder: Path, *args: str) -> list[dict]:
    proc = subprocess.run(
        ["node", SENDER.name, *args], cwd=folder, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout)
    assert out["exports"] == {"0": out["exports"]["0"]}, proc.stderr[-2000:]  # all succeeded
    return out["spans"]


@pytest.mark.parametrize("transport", ["http", "http-gzip", "grpc"])
def test_node_sdk_spans_are_stored(node_client: Path, tmp_path: Path, transport: str) -> None:
    c = Collector(tmp_path / "node")
    try:
        where = ["--http", c.url] if transport.startswith("http") else ["--grpc", c.grpc_target]
        sent = send(
            node_client, *where, "--spans", "120", *(["--gzip"] if "gzip" in transport else [])
        )
    finally:
        c.close()
    rows = stored(c.out)
    assert len(sent) == len(rows) == 120
    roots = [s for s in sent if s["parent"] is None]
    assert [s["name"] for s in roots] == ["request"]
    for s in sent:
        r = rows[s["span_id"]]
        assert (r["trace_id"], r["parent_span_id"], r["name"]) == (
            s["trace_id"],
            s["parent"],
            s["name"],
        )
        assert (r["start_ns"], r["end_ns"]) == (int(s["start"]), int(s["end"]))
        assert (r["service"], r["host"], r["scope"]) == ("node-app", "node-host", "node.lib")
        chip = s["attributes"].get("chip.id")
        # chip.type is derived from chip.id; an id naming no chip type leaves it NULL
        expected_type = chip.split(":")[0] if chip and chip.startswith("gpu") else None
        assert (r["chip_id"], r["chip_type"]) == (chip, expected_type)
        want = dict(s["attributes"], **({"chip.type": expected_type} if expected_type else {}))
        assert span_attributes(r) == want
        events = json.loads(r["events"]) if r["events"] else []
        assert [e["name"] for e in events] == s["events"]
