"""Steps (the guess, `--step GLOB`, several workloads) and the rules for traces that are not
emulated: step-time outliers, host CPU contention, error rate and latency of a service."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from analysis_helpers import MS, T0, TraceBuilder, collector

from chiptrace.analysis import TraceAnalysis
from chiptrace.cli import main
from chiptrace.host.metrics import METRICS_TABLE, METRICS_WRITE_OPTIONS, Sample, SampleBuffer
from chiptrace.store import PartWriter


def _torch_loop(
    b: TraceBuilder, steps: int = 20, slow: int = 13, factor: float = 27, name: str = "ProfilerStep"
) -> None:
    """One `train` root; under it ProfilerStep#N, each a data load and three ops on a GPU.
    Step `slow` waits `factor` times a step for its data."""
    tr = b.new_trace()
    step_us = 1000.0
    total = steps * step_us + (factor - 1) * step_us
    root = b.span("train", 0, total, trace=tr)
    t = 0.0
    for i in range(steps):
        data_us = 100 + (factor - 1) * step_us if i == slow else 100
        dur = data_us + 900
        s = b.span(f"{name}#{i}", t, t + dur, trace=tr, parent=root)
        b.span("DataLoader.__next__", t, t + data_us, trace=tr, parent=s, chip="cpu:0", op="host")
        for k in range(3):
            a = t + data_us + 300 * k
            b.span("aten::mm", a, a + 300, trace=tr, parent=s, chip="gpu:0")
        t += dur


def _busy_host(d: Path, t0_ns: int, t1_ns: int, cpus: int = 4, program_pct: float = 30) -> None:
    """Host samples as `chiptrace record` writes them: every CPU at 100%, the program at 0.3
    of a core (something else is hogging the machine)."""
    buf = SampleBuffer(host="box", run_id="test", pid=1)
    for ts in range(t0_ns, t1_ns, (t1_ns - t0_ns) // 20):
        samples = [Sample("cpu.util", 100.0, f"cpu:{i}", "cpu") for i in range(cpus)]
        buf.add(ts, samples + [Sample("proc.cpu", program_pct)])
    writer = PartWriter(
        d, manifest={"run_id": "test"}, table=METRICS_TABLE, write_options=METRICS_WRITE_OPTIONS
    )
    writer.write(buf.take())
    writer.write_manifest()


def test_guess_prefers_a_numbered_repeating_span_that_is_not_a_root(tmp_path: Path) -> None:
    b = TraceBuilder()
    _torch_loop(b, name="Iteration")
    ta = TraceAnalysis(b.write(tmp_path / "t"))
    (w,) = ta.tables.workloads
    assert w.name == "Iteration#*" and w.steps.num_rows == 20
    assert "differ by a number" in w.choice.reason and "repeats" in w.choice.reason


def test_guess_takes_profiler_steps_first(tmp_path: Path) -> None:
    b = TraceBuilder()
    _torch_loop(b)
    tr = b.new_trace()  # a lone profiler step without children still counts
    b.span("ProfilerStep#20", 40_000, 40_050, trace=tr)
    ta = TraceAnalysis(b.write(tmp_path / "t"))
    (w,) = ta.tables.workloads
    assert w.name == "ProfilerStep#*" and w.steps.num_rows == 21
    assert "PyTorch profiler" in w.choice.reason


def test_pytorch_loop_outlier_step_and_busy_host(tmp_path: Path, capsys) -> None:
    b = TraceBuilder()
    _torch_loop(b)
    d = b.write(tmp_path / "t")
    _busy_host(d, T0, T0 + 47 * MS)
    findings = TraceAnalysis(d).findings()
    rules = {f.rule: f for f in findings}
    out = rules["step-outliers"]
    assert out.severity == "medium" and out.step == "ProfilerStep#*"  # one slow step: a one-off
    assert out.evidence["slowest_vs_median"] == pytest.approx(27, rel=0.05)
    assert out.evidence["slowest_step"] == "ProfilerStep#13"
    assert next(iter(out.evidence["extra_ms_on"])) == "DataLoader.__next__"
    # 26 extra steps' worth over 20 steps: 1.3 steps per step, capped at the whole step
    assert out.saving_ns == pytest.approx(26 * MS / 20, rel=0.05)
    host = rules["host-contention"]
    assert host.severity == "high" and host.evidence["program_cores"] == pytest.approx(0.3)
    assert main(["report", str(d), "--step", "ProfilerStep#*"]) == 0
    text = capsys.readouterr().out
    assert "step-outliers" in text and "host-contention" in text and "--step" in text


def test_step_glob_that_matches_nothing_is_one_line(tmp_path: Path, capsys) -> None:
    b = TraceBuilder()
    _torch_loop(b, steps=5, slow=-1)
    d = b.write(tmp_path / "t")
    assert main(["report", str(d), "--step", "GET /*"]) == 2
    err = capsys.readouterr().err.strip()
    assert (
        err.startswith("chiptrace: error: --step 'GET /*' matches no span name") and "\n" not in err
    )
    assert "'aten::mm' (15)" in err and "'DataLoader.__next__' (5)" in err
    assert err.count("(") == 5  # the five most common names


def test_step_glob_need_not_be_a_root(tmp_path: Path, capsys) -> None:
    b = TraceBuilder()
    _torch_loop(b, steps=6, slow=-1)
    d = b.write(tmp_path / "t")
    assert main(["report", str(d), "--step", "ProfilerStep#*", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    (w,) = data["workloads"]
    assert w["step"] == "ProfilerStep#*" and w["steps"] == 6 and "--step" in w["reason"]
    assert main(["report", str(d), "--step", "aten::*", "--json"]) == 0  # leaves may be steps
    assert json.loads(capsys.readouterr().out)["metrics"]["steps"] == 18


def test_mixed_workloads_are_analysed_apart(tmp_path: Path) -> None:
    emulator = pytest.importorskip("chiptrace.emulator")
    out = tmp_path / "mixed"
    emulator.emulate(
        workload="mixed", steps=4, seed=1, out=out, progress=False, faults=["straggler:gpu:5:5"]
    )
    ta = TraceAnalysis(out)
    names = [w.name for w in ta.tables.workloads]
    assert names == ["train_step", "request"]  # batch: what requests link to, not a workload
    report = ta.report().to_dict()
    train, req = report["workloads"]
    assert train["steps"] == 4 and req["steps"] > 4
    assert train["comm_share"] is not None and report["metrics"]["step"] == "train_step"
    top = report["findings"][0]
    assert (top["rule"], top["culprit"], top["step"]) == ("straggler", "gpu:5", "train_step")
    assert not [f for f in report["findings"] if f["rule"] == "load-imbalance"]


def test_load_imbalance_compares_one_model(tmp_path: Path) -> None:
    """An NVLink switch forwarding all-reduce and an Ethernet switch forwarding input are
    not peers; two NPUs of one model doing one job are."""
    b = TraceBuilder()
    for s in range(4):
        tr = b.new_trace()
        root = b.span("step", s * 1000, s * 1000 + 1000, trace=tr)
        b.span("forward", s * 1000, s * 1000 + 900, trace=tr, parent=root, chip="switch:0")
        b.span("forward", s * 1000, s * 1000 + 100, trace=tr, parent=root, chip="switch:1")
    topo = {
        "chips": [
            {"id": "switch:0", "type": "switch", "model": "NVLinkSwitch"},
            {"id": "switch:1", "type": "switch", "model": "SpectrumX"},
        ]
    }
    ta = TraceAnalysis(b.write(tmp_path / "t", manifest={"topology": topo}))
    assert ta.findings(["load-imbalance"]) == []


def test_a_child_outliving_its_step_never_passes_100_percent(tmp_path: Path) -> None:
    b = TraceBuilder()
    for s in range(4):
        tr = b.new_trace()
        root = b.span("step", s * 1000, s * 1000 + 500, trace=tr)
        b.span(
            "ar",
            s * 1000 - 200,
            s * 1000 + 1400,
            trace=tr,
            parent=root,
            link="nvlink5:gpu:0-gpu:1",
            src="gpu:0",
            dst="gpu:1",
            nbytes=1 << 20,
        )
        b.span("mm", s * 1000 + 100, s * 1000 + 900, trace=tr, parent=root, chip="gpu:0")
    ta = TraceAnalysis(b.write(tmp_path / "t"))
    m = ta.metrics()
    assert 0 < m["comm_share"] <= 1 and 0 < m["critical_path_comm_share"] <= 1
    assert all(0 <= f.share <= 1 for f in ta.findings())
    assert all(v <= 1 for v in ta.critical_path().share("chip_type").values())


def _send_web_app(url: str, requests: int = 40, error_every: int = 4) -> None:
    """A web app on the real OpenTelemetry SDK: server spans, a DB child, 25% HTTP 500s."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from opentelemetry.trace import SpanKind, Status, StatusCode

    tp = TracerProvider(resource=Resource({"service.name": "shop"}))
    tp.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=url, timeout=30)))
    tracer = tp.get_tracer("web")
    for i in range(requests):
        route = "GET /users/{id}" if i % 2 else "POST /orders"
        with tracer.start_as_current_span(route, kind=SpanKind.SERVER) as s:
            with tracer.start_as_current_span("SELECT users", kind=SpanKind.CLIENT):
                pass
            if i % error_every == 0:
                s.set_attribute("http.response.status_code", 500)
                s.set_status(Status(StatusCode.ERROR, "HTTP 500"))
    tp.shutdown()


def test_web_app_error_rate_through_collect(tmp_path: Path, capsys) -> None:
    out = tmp_path / "web"
    with collector(out) as url:
        _send_web_app(url)
    assert main(["report", str(out), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    errors = {f["culprit"]: f for f in data["findings"] if f["rule"] == "error-rate"}
    post = errors["POST /orders"]  # requests 0, 4, 8, ... are all POSTs: half of them fail
    assert post["severity"] == "high" and post["evidence"]["error_rate"] == 0.5
    assert post["evidence"]["error_message"] == "HTTP 500" and post["step"] == "POST /orders"
    assert data["findings"][0]["rule"] == "error-rate"
    rows = {r["name"]: r for r in data["endpoints"]}
    assert rows["GET /users/{id}"]["requests"] == 20 and rows["GET /users/{id}"]["errors"] == 0
    assert rows["POST /orders"]["kind"] == "server" and rows["POST /orders"]["p99_ms"] is not None
    assert main(["report", str(out)]) == 0
    assert "Endpoints (server spans)" in capsys.readouterr().out
