"""Spans from other OpenTelemetry SDKs: `chip.id` without `chip.type`, no op.bytes, sent as
OTLP/JSON to `chiptrace collect`, then every report path and the viewer's summary."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

from analysis_helpers import collector

from chiptrace.cli import main

T0 = 1_760_000_000_000_000_000


def _attrs(**kv: object) -> list[dict]:
    out = []
    for k, v in kv.items():
        val = {"intValue": str(v)} if isinstance(v, int) else {"stringValue": str(v)}
        out.append({"key": k.replace("_", "."), "value": val})
    return out


def _request(steps: int = 4, gpus: int = 4) -> bytes:
    """OTLP/JSON as the specification writes it: camelCase, hex ids, times as strings."""
    spans = []
    sid = 1
    for s in range(steps):
        trace = f"{s + 1:032x}"
        root = f"{sid:016x}"
        t = T0 + s * 10_000_000
        spans.append(
            {
                "traceId": trace,
                "spanId": root,
                "name": "train_step",
                "kind": 1,
                "startTimeUnixNano": str(t),
                "endTimeUnixNano": str(t + 9_000_000),
            }
        )
        sid += 1
        for g in range(gpus):
            slow = 3 if g == 2 else 1  # gpu:2 is the straggler
            spans.append(
                {
                    "traceId": trace,
                    "spanId": f"{sid:016x}",
                    "parentSpanId": root,
                    "name": "matmul",
                    "kind": 1,
                    "startTimeUnixNano": str(t + 100_000),
                    "endTimeUnixNano": str(t + 100_000 + slow * 2_000_000),
                    "attributes": _attrs(chip_id=f"gpu:{g}"),
                }
            )
            sid += 1
            spans.append(
                {
                    "traceId": trace,
                    "spanId": f"{sid:016x}",
                    "parentSpanId": root,
                    "name": "h2d",
                    "kind": 1,
                    "startTimeUnixNano": str(t),
                    "endTimeUnixNano": str(t + 50_000),
                    "attributes": _attrs(link_id=f"pcie5:cpu:0-gpu:{g}"),
                }
            )
            sid += 1
    doc = {
        "resourceSpans": [
            {
                "resource": {"attributes": _attrs(service_name="foreign")},
                "scopeSpans": [{"scope": {"name": "sdk"}, "spans": spans}],
            }
        ]
    }
    return json.dumps(doc).encode()


def _collect(out: Path, body: bytes) -> None:
    with collector(out) as url:
        req = urllib.request.Request(
            url, data=body, method="POST", headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(req, timeout=60) as resp:
            assert resp.status == 200


def test_otlp_json_without_chip_type_through_collect(tmp_path: Path, capsys) -> None:
    out = tmp_path / "collected"
    _collect(out, _request())
    assert main(["report", str(out)]) == 0
    text = capsys.readouterr().out
    assert "straggler" in text and "gpu:2" in text
    assert main(["report", str(out), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert {c["chip_type"] for c in data["chips"]} == {"gpu"}
    assert {lk["link_type"] for lk in data["links"]} == {"pcie5"}
    assert data["findings"][0]["culprit"] == "gpu:2"
    assert main(["report", str(out), "--html", str(tmp_path / "r.html")]) == 0
    assert main(["diff", str(out), str(out)]) == 0
    capsys.readouterr()
    assert main(["view", str(out), "--no-ui"]) == 0
    view = capsys.readouterr().out
    assert "gpu       4 chips" in view, view
