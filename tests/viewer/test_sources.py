"""Sources: OTLP/HTTP from a real OpenTelemetry SDK, the in-process feed, the CLI."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from viewer_helpers import screen_text, until

import chiptrace
from chiptrace.cli import main
from chiptrace.config import resolve
from chiptrace.errors import ConfigError
from chiptrace.recorder import Recorder, StoreSink
from chiptrace.store import PartWriter
from chiptrace.viewer.app import ViewerApp
from chiptrace.viewer.otlp import OtlpSource, parse_address
from chiptrace.viewer.sources import FeedSource, SpanFeed


def _send_spans(port: int, n: int) -> None:
    provider = TracerProvider(resource=Resource.create({"service.name": "otlp-test"}))
    exporter = OTLPSpanExporter(endpoint=f"http://127.0.0.1:{port}/v1/traces")
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("t")
    with tracer.start_as_current_span("step"):
        for i in range(n):
            with tracer.start_as_current_span(
                "matmul",
                attributes={
                    "chip.id": f"gpu:{i % 2}",
                    "chip.type": "gpu",
                    "op.kind": "compute",
                    "op.flops": 1 << 30,
                    "user.tag": "x",
                },
            ):
                time.sleep(0.001)
    provider.shutdown()


async def test_otlp_http_from_the_sdk_reaches_dashboard_and_store(tmp_path: Path) -> None:
    out = tmp_path / "otlp-out"
    source = OtlpSource("127.0.0.1", 0, out=out)
    app = ViewerApp([source], feed=source.feed, window_ns=1_000_000_000)
    try:
        async with app.run_test(size=(80, 24)) as pilot:
            _send_spans(source.port, 6)
            await until(pilot, lambda: app.model.spans_total >= 7, "7 spans ingested")
            app.refresh_dashboard()
            await pilot.pause()
            assert app.model.spans_total == 7
            gpus = [r.id for r in app.snapshot.chips["gpu"]]
            assert gpus == ["gpu:0", "gpu:1"]
            assert "GPU ×2" in screen_text(app)
    finally:
        source.stop()
    con = chiptrace.connect(out)
    rows = con.sql(
        "SELECT name, chip_id, op_flops, attributes FROM spans WHERE chip_id IS NOT NULL"
    ).fetchall()
    assert len(rows) == 6
    assert rows[0][2] == 1 << 30 and '"user.tag":"x"' in rows[0][3]


def test_otlp_rejects_garbage(tmp_path: Path) -> None:
    import urllib.error
    import urllib.request

    source = OtlpSource("127.0.0.1", 0, out=tmp_path / "o")
    try:
        req = urllib.request.Request(
            f"http://127.0.0.1:{source.port}/v1/traces",
            data=b"\xff\x00garbage",
            headers={"Content-Type": "application/x-protobuf"},
        )
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(req, timeout=5)
        assert e.value.code == 400
        assert source.receiver.stats.errors == 1
        assert source.feed.received == 0
    finally:
        source.stop()


def test_parse_address() -> None:
    assert parse_address("127.0.0.1:4318") == ("127.0.0.1", 4318)
    assert parse_address("9999") == ("127.0.0.1", 9999)
    with pytest.raises(ConfigError, match="HOST:PORT"):
        parse_address("localhost:http")


async def test_in_process_feed_is_a_recorder_sink(tmp_path: Path) -> None:
    from viewer_rack import step_batch

    feed = SpanFeed()
    store = tmp_path / "fed"
    writer = PartWriter(store)
    recorder = Recorder(
        resolve(dir=store, flush_interval_s=0.05), [StoreSink(writer), feed], writer
    )
    app = ViewerApp([FeedSource(store)], feed=feed, window_ns=100_000_000)
    async with app.run_test(size=(80, 24)) as pilot:
        recorder.write_batch(step_batch(0, 0), block=True)
        await until(pilot, lambda: app.model.spans_total, "the batch ingested")
        assert app.model.spans_total == 812
    recorder.shutdown()


def test_feed_drops_and_counts_when_full() -> None:
    from viewer_rack import step_batch

    feed = SpanFeed(max_spans=1000)
    feed.write(step_batch(0, 0))
    feed.write(step_batch(1, 0))
    assert (feed.received, feed.dropped) == (812, 812)
    assert sum(b.num_rows for b in feed.drain()) == 812


def test_cli_view_no_ui_prints_summary(rack_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["view", str(rack_dir), "--no-ui"]) == 0
    out = capsys.readouterr().out
    assert "gpu" in out and "switch" in out
    assert "ALERT high: gpu:3 idle" in out


def test_cli_view_bad_arguments(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["view"]) == 2
    assert "give a trace DIR" in capsys.readouterr().err
    f = tmp_path / "file.txt"
    f.write_text("x")
    assert main(["view", str(f), "--no-ui"]) == 2
    assert "not a file" in capsys.readouterr().err
    assert main(["view", "--otlp", "nohost:port"]) == 2
    assert "HOST:PORT" in capsys.readouterr().err


def test_cli_view_screenshot(rack_dir: Path, tmp_path: Path) -> None:
    svg = tmp_path / "shots" / "dash.svg"
    assert main(["view", str(rack_dir), "--screenshot", str(svg)]) == 0
    text = svg.read_text()
    assert text.startswith("<svg") and "GPU" in text and "ALERTS" in text


async def test_emulator_feeds_the_viewer_in_process(tmp_path: Path) -> None:
    pytest.importorskip("chiptrace.emulator.run")
    from chiptrace.viewer.launch import emulator_app

    app, run = emulator_app(
        tmp_path / "emu",
        topology="rack6",
        workload="train",
        steps=3,
        faults=["degrade:nvlink6:gpu:0-switch:0:0.05"],
        # Ops at their roofline, the timings this check's window was sized on: with kernel
        # efficiencies Adam's ~9 ms at the step's end leaves the link idle 10% of the window.
        options={"efficiency": "ideal"},
    )
    run.start()
    async with app.run_test(size=(100, 32)) as pilot:
        assert run.done.wait(60) and run.error is None
        await until(pilot, lambda: app.model.spans_total >= run.result.spans, "every span")
        assert app.window_ns == 1_000_000_000  # the live default: holds all 3 steps
        await pilot.press("+", "+", "+")  # zoom in to the last 100 ms: steady state
        app.refresh_dashboard()
        await pilot.pause()
        assert app.window_ns == 100_000_000
        assert app.model.spans_total == run.result.spans
        assert len(app.snapshot.chips["gpu"]) == 8
        # The degraded link: busy all the window at a few % of its nominal bandwidth.
        link = {r.id: r for r in app.snapshot.links}["nvlink6:gpu:0-switch:0"]
        assert link.bandwidth and link.saturation < 0.1 and link.utilization > 0.9
        high = {a.culprit for a in app.alerts if a.severity == "high"}
        assert "nvlink6:gpu:0-switch:0" in high
        assert "nvlink6:gpu:7-switch:0" not in high  # a hop after it: slow, not the culprit


def test_replay_paces_a_finished_trace(rack_dir: Path, monkeypatch) -> None:
    from types import SimpleNamespace

    from chiptrace.viewer import sources
    from chiptrace.viewer.sources import DirSource

    # Replay paces to the wall clock; here the clock is the test's, so load cannot bunch polls.
    clock = [0.0]
    monkeypatch.setattr(sources, "time", SimpleNamespace(monotonic=lambda: clock[0]))
    total = chiptrace.connect(rack_dir).sql("SELECT count(*) FROM spans").fetchall()[0][0]
    src, feed = DirSource(rack_dir, replay=2.0), SpanFeed()  # the 1 s trace in 0.5 s
    src.poll(feed)
    first = sum(b.num_rows for b in feed.drain())
    assert first < total / 4  # only what ended in the first instant
    seen, ends = first, []
    for _ in range(100):  # 5 s of the test's clock, 0.05 s a poll
        if seen == total:
            break
        clock[0] += 0.05
        src.poll(feed)
        for b in feed.drain():
            seen += b.num_rows
            ends.append(b.column("end_ns").to_numpy().max())
    assert seen == total
    assert ends == sorted(ends) and len(ends) > 3  # in end order, over several polls


def test_cli_view_otlp_no_ui_receives_until_interrupted(tmp_path: Path) -> None:
    import re
    import signal
    import subprocess
    import sys

    out = tmp_path / "stored"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "chiptrace",
            "view",
            "--otlp",
            "127.0.0.1:0",
            "--out",
            str(out),
            "--no-ui",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        line = proc.stdout.readline()
        port = int(re.search(r":(\d+)/v1/traces", line).group(1))
        _send_spans(port, 4)  # returns once acknowledged: the spans are in the feed
        proc.send_signal(signal.SIGINT)
        rest = proc.communicate(timeout=30)[0]
    finally:
        proc.kill()
    assert proc.returncode == 0
    assert "5 spans seen" in rest and "gpu       2 chips" in rest
    assert chiptrace.connect(out).sql("SELECT count(*) FROM spans").fetchall()[0][0] == 5
