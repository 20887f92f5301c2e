"""chiptrace's own exports import back to the same spans; OTLP JSON/JSONL and Jaeger import."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import chiptrace
from tests.importers.conftest import JAEGER

_COLS = (
    "trace_id, span_id, parent_span_id, name, {start}, {dur}, chip_id, chip_type, link_id, "
    "link_src, link_dst, op_kind, op_bytes, op_flops, op_precision, attributes, service, "
    "status_code"
)


def _run(*args: str) -> None:
    r = subprocess.run([sys.executable, "-m", "chiptrace", *args], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


@pytest.fixture(scope="module")
def emulated(tmp_path_factory):
    out = tmp_path_factory.mktemp("emulated")
    args = "emulate --topology rack6 --workload train --steps 2 --seed 3 --no-progress --out"
    _run(*args.split(), str(out))
    return out


@pytest.mark.parametrize("fmt,unit", [("chrome", 1), ("jaeger-json", 1000)])
def test_export_imports_back_to_the_same_spans(emulated, tmp_path, fmt, unit):
    f = tmp_path / "export.json"
    _run("export", str(emulated), "--format", fmt, "-o", str(f))
    out = tmp_path / "back"
    _run("import", str(f), "--out", str(out))
    cols = _COLS.format(start=f"start_ns // {unit}", dur=f"(end_ns - start_ns) // {unit}")
    q = f"SELECT {cols} FROM spans ORDER BY span_id"
    want = chiptrace.connect(emulated).execute(q).fetchall()
    got = chiptrace.connect(out).execute(q).fetchall()
    assert len(want) > 1000 and got == want


def _otlp_request(span_id: str, parent: str = "") -> dict:
    span = {
        "traceId": "0af7651916cd43dd8448eb211c80319c",
        "spanId": span_id,
        "name": f"op-{span_id[-1]}",
        "kind": 1,
        "startTimeUnixNano": "1700000000000000123",
        "endTimeUnixNano": "1700000000000500123",
        "attributes": [
            {"key": "chip.id", "value": {"stringValue": "gpu:1"}},
            {"key": "op.bytes", "value": {"intValue": "4096"}},
            {"key": "user.tag", "value": {"stringValue": "x"}},
        ],
    }
    if parent:
        span["parentSpanId"] = parent
    return {
        "resourceSpans": [
            {
                "resource": {
                    "attributes": [{"key": "service.name", "value": {"stringValue": "svc"}}]
                },
                "scopeSpans": [{"scope": {"name": "s"}, "spans": [span]}],
            }
        ]
    }


@pytest.mark.parametrize("lines", [False, True])
def test_otlp_json_and_jsonl(tmp_path, lines):
    reqs = [
        _otlp_request("00f067aa0ba902b7"),
        _otlp_request("00f067aa0ba902b8", "00f067aa0ba902b7"),
    ]
    f = tmp_path / ("spans.jsonl" if lines else "spans.json")
    if lines:
        f.write_text("\n".join(json.dumps(r) for r in reqs) + "\n")
    else:
        one = reqs[0]
        one["resourceSpans"][0]["scopeSpans"][0]["spans"] += reqs[1]["resourceSpans"][0][
            "scopeSpans"
        ][0]["spans"]
        f.write_text(json.dumps(one, indent=2))
    out = tmp_path / "o"
    _run("import", str(f), "--out", str(out))
    rows = (
        chiptrace.connect(out)
        .execute(
            "SELECT span_id, parent_span_id, start_ns, end_ns, chip_id, chip_type, op_bytes, "
            "attributes->>'user.tag', service FROM spans ORDER BY span_id"
        )
        .fetchall()
    )
    same = (1700000000000000123, 1700000000000500123, "gpu:1", "gpu", 4096, "x", "svc")
    assert rows == [
        ("00f067aa0ba902b7", None, *same),
        ("00f067aa0ba902b8", "00f067aa0ba902b7", *same),
    ]


@pytest.mark.parametrize(
    "name",
    [
        "jaeger_converter_ui_01.json",
        "jaeger_query_otlp2jaeger-out.json",
        "upload_valid_petclinic.json",
        "ui_testTraceNormal.json",
    ],
)
def test_jaeger_files_import_every_span(tmp_path, name):
    doc = json.loads((JAEGER / name).read_text())
    traces = doc["data"] if "data" in doc else [doc]
    spans = [sp for tr in traces for sp in tr["spans"]]
    summary = chiptrace.import_trace(JAEGER / name, tmp_path)
    assert summary.spans == len(spans)
    got = (
        chiptrace.connect(tmp_path)
        .execute("SELECT span_id, name, start_ns // 1000, (end_ns - start_ns) // 1000 FROM spans")
        .fetchall()
    )
    want = [
        (sp["spanID"].rjust(16, "0"), sp["operationName"], sp["startTime"], sp["duration"])
        for sp in spans
    ]
    assert sorted(got) == sorted(want)
