"""Jaeger JSON against the real format (fixtures from Jaeger's repositories)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from chiptrace.cli import main
from chiptrace.importers.jaeger import JaegerFormatError, read_jaeger_json
from tests.exporters.conftest import stored_rows

# shared/ sits beside the checkout (here and in CI's fresh clone).
_CANDIDATES = [
    Path(__file__).resolve().parents[3] / "shared" / "fixtures" / "jaeger",
    Path("/work/shared/fixtures/jaeger"),
]
FIXTURES = next((p for p in _CANDIDATES if p.is_dir()), _CANDIDATES[0])
needs_fixtures = pytest.mark.skipif(not FIXTURES.is_dir(), reason="Jaeger fixtures not present")


@pytest.fixture
def exported(code_trace: Path, tmp_path: Path) -> dict:
    out = tmp_path / "trace.jaeger.json"
    assert main(["export", str(code_trace), "--format", "jaeger-json", "-o", str(out)]) == 0
    return json.loads(out.read_text())


@needs_fixtures
def test_same_structure_as_jaeger_query_output(exported: dict) -> None:
    real = json.loads((FIXTURES / "upload_valid_petclinic.json").read_text())
    assert exported.keys() == real.keys()
    real_trace, real_span = real["data"][0], real["data"][0]["spans"][0]
    for trace in exported["data"]:
        assert trace.keys() == real_trace.keys()
        for span in trace["spans"]:
            assert span.keys() == real_span.keys()
            assert span["processID"] in trace["processes"]
            for ref in span["references"]:
                assert ref.keys() == real_span["references"][0].keys()
            for tag in span["tags"]:
                assert tag.keys() == real_span["tags"][0].keys()
                assert tag["type"] in ("string", "bool", "int64", "float64", "binary")
            for log in span["logs"]:
                assert log.keys() == {"timestamp", "fields"}
        for proc in trace["processes"].values():
            assert proc.keys() == real_trace["processes"]["p1"].keys()


def test_times_in_microseconds_and_ids_in_hex(exported: dict, code_trace: Path) -> None:
    rows = {r["span_id"].hex(): r for r in stored_rows(code_trace)}
    spans = [s for t in exported["data"] for s in t["spans"]]
    assert len(spans) == len(rows) == 11
    for s in spans:
        r = rows[s["spanID"]]
        assert s["traceID"] == r["trace_id"].hex() and len(s["traceID"]) == 32
        assert s["startTime"] == r["start_ns"] // 1000
        assert s["duration"] == (r["end_ns"] - r["start_ns"]) // 1000
        if r["parent_span_id"]:
            assert s["references"][0] == {
                "refType": "CHILD_OF",
                "traceID": s["traceID"],
                "spanID": r["parent_span_id"].hex(),
            }
        for log, ev in zip(s["logs"], json.loads(r["events"] or "[]"), strict=True):
            assert log["timestamp"] == ev["time_ns"] // 1000


def test_typed_tags_references_and_processes(exported: dict) -> None:
    spans = {s["operationName"]: s for t in exported["data"] for s in t["spans"]}
    tags = {t["key"]: (t["type"], t["value"]) for t in spans["_decorated_workload.matmul"]["tags"]}
    assert tags["op.flops"] == ("int64", 2**40)
    assert tags["layer"] == ("int64", 3)
    assert tags["chip.id"] == ("string", "gpu:0")
    assert tags["op.precision"] == ("string", "bf16")
    assert tags["ratio"][0] == "float64"
    step = {t["key"]: (t["type"], t["value"]) for t in spans["step"]["tags"]}
    assert step["ok"] == ("bool", True) and step["tags"] == ("string", '["a","b"]')
    assert step["span.kind"] == ("string", "server")
    assert spans["step"]["logs"][0]["fields"][0] == {
        "key": "event",
        "type": "string",
        "value": "begin",
    }
    bad = {t["key"]: t["value"] for t in spans["bad"]["tags"]}
    assert bad["error"] is True and bad["otel.status_code"] == "ERROR"
    assert bad["otel.status_description"] == "disk on fire"
    refs = [r["refType"] for r in spans["load"]["references"]]
    assert refs == ["CHILD_OF", "FOLLOWS_FROM"]
    remote = next(t for t in exported["data"] if t["traceID"] == "07" * 16)
    (proc,) = remote["processes"].values()
    assert proc["serviceName"] == "remote"
    assert {"key": "host.name", "type": "string", "value": "node2"} in proc["tags"]
    trainer = next(t for t in exported["data"] if t["spans"][0]["operationName"] == "step")
    (proc,) = trainer["processes"].values()
    assert proc["serviceName"] == "trainer"
    assert {"key": "deployment.environment", "type": "string", "value": "test"} in proc["tags"]


def test_round_trip_counts(code_trace: Path, tmp_path: Path) -> None:
    out = tmp_path / "t.json"
    assert (
        main(
            [
                "export",
                str(code_trace),
                "-f",
                "jaeger-json",
                "-o",
                str(out),
                "--where",
                "service='remote'",
            ]
        )
        == 0
    )
    back = read_jaeger_json(out)
    assert (len(back.traces), back.spans, back.warnings) == (1, 4, [])
    out2 = tmp_path / "all.json"
    assert main(["export", str(code_trace), "-f", "jaeger-json", "-o", str(out2)]) == 0
    back = read_jaeger_json(out2)
    assert (len(back.traces), back.spans, back.warnings) == (3, 11, [])


@needs_fixtures
@pytest.mark.parametrize(
    "name, spans", [("upload_valid_petclinic.json", 5), ("ui_testTraceNormal.json", 5)]
)
def test_reads_real_files(name: str, spans: int) -> None:
    got = read_jaeger_json(FIXTURES / name)
    assert got.spans == spans and got.warnings == []


@needs_fixtures
def test_bad_files_get_clear_errors_and_warnings() -> None:
    with pytest.raises(JaegerFormatError, match=r"traceID='trace-123' is not a hex id"):
        read_jaeger_json(FIXTURES / "ui_TraceGraph_testTrace.json")
    dup = read_jaeger_json(FIXTURES / "jaeger_converter_ui_01.json")
    assert any("duplicate spanID 0000000000000002" in w for w in dup.warnings)
    orphan = read_jaeger_json(FIXTURES / "jaeger_query_otlp2jaeger-out.json")
    assert any("parent 909541b92cf05311 is missing" in w for w in orphan.warnings)


def test_not_json(tmp_path: Path) -> None:
    bad = tmp_path / "x.json"
    bad.write_text("{nope")
    with pytest.raises(JaegerFormatError, match="not JSON"):
        read_jaeger_json(bad)
