"""Sinks other than the store run on their own queue and thread: a SpanExporter that
hangs for good delays neither the program, nor the store, nor exit past the deadline."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import chiptrace
from chiptrace.store import read_manifests

_HUNG_CHILD = textwrap.dedent(
    """
    import sys, threading, time, chiptrace
    from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

    class Hung(SpanExporter):
        def export(self, spans):
            threading.Event().wait()  # a collector that never answers
            return SpanExportResult.SUCCESS
        def shutdown(self):
            threading.Event().wait()

    chiptrace.init(sys.argv[1], exporters=[Hung()], flush_interval_s=3600)
    t0 = time.perf_counter()
    for i in range(3):
        for _ in range(1000):
            with chiptrace.span("work", chip="cpu:0"):
                pass
        assert chiptrace.flush() == 1000  # the store has them; the exporter is stuck
    print(f"{time.perf_counter() - t0:.3f}", flush=True)
    """
)


def test_a_hung_exporter_delays_neither_program_store_nor_exit(tmp_path: Path) -> None:
    out = tmp_path / "t"
    env = {**os.environ, "CHIPTRACE_SHUTDOWN_TIMEOUT": "1", "OTEL_BSP_EXPORT_TIMEOUT": "200"}
    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-c", _HUNG_CHILD, str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    took = time.monotonic() - t0
    assert proc.returncode == 0, proc.stderr
    # 3 explicit flushes each wait at most the shutdown timeout for a sink not yet hung,
    # then exit waits at most it again: far from the 60 s a blocking exporter would take.
    assert took < 20, took
    con = chiptrace.connect(out)
    assert con.sql("SELECT count(*) FROM spans").fetchall()[0][0] == 3000
    (m,) = read_manifests([out])
    assert m.get("sink_spans_dropped", 0) >= 1000 and m["spans_dropped"] == 0
    assert "did not finish" in proc.stderr or "dropping its spans" in proc.stderr


def test_exporters_get_every_span_on_their_own_thread(tmp_path: Path) -> None:
    from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

    got: list[tuple[str, str]] = []

    class Keep(SpanExporter):
        def export(self, spans):  # type: ignore[no-untyped-def]
            import threading

            got.extend((s.name, threading.current_thread().name) for s in spans)
            return SpanExportResult.SUCCESS

    chiptrace.init(tmp_path / "t", exporters=[Keep()], flush_interval_s=3600)
    try:
        for _ in range(1500):
            with chiptrace.span("w"):
                pass
        assert chiptrace.flush() == 1500
        assert len(got) == 1500  # an explicit flush waits for the sink (within its timeout)
        assert {t for _, t in got} == {"chiptrace-sink-ExporterSink"}
    finally:
        chiptrace.shutdown()


def test_spans_an_exporter_fails_on_are_counted(tmp_path: Path) -> None:
    from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

    class Flaky(SpanExporter):
        """Takes its first call, raises on the second, refuses the rest."""

        calls = 0

        def export(self, spans):  # type: ignore[no-untyped-def]
            self.calls += 1
            if self.calls == 2:
                raise OSError("connection reset")
            return SpanExportResult.SUCCESS if self.calls == 1 else SpanExportResult.FAILURE

    out = tmp_path / "t"
    rec = chiptrace.init(out, exporters=[Flaky()], flush_interval_s=3600)
    assert rec is not None
    try:
        for _ in range(3):
            for _ in range(1000):  # two export calls of 512 spans, the second partial
                with chiptrace.span("w"):
                    pass
            chiptrace.flush()
    finally:
        chiptrace.shutdown()
    # Delivered: the first call's 512; the rest of that table and the two tables after
    # went nowhere, and the manifest says so (only the failed writes were counted before).
    (m,) = read_manifests([out])
    assert m["spans_written"] == 3000 and m["sink_spans_dropped"] == 3000 - 512
    assert rec.sink_errors == 3


_SLOW_CHILD = textwrap.dedent(
    """
    import sys, time, chiptrace
    from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

    class Slow(SpanExporter):
        def export(self, spans):
            time.sleep(0.5)  # a collector far away: 512 spans a half second
            return SpanExportResult.SUCCESS

    chiptrace.init(sys.argv[1], exporters=[Slow()], flush_interval_s=3600)
    for _ in range(10_000):
        with chiptrace.span("work"):
            pass
    print(time.monotonic(), flush=True)  # exit starts: ~10 s of exporting left
    """
)


def _exit_with_deadline(child: str, *args: str) -> tuple[subprocess.CompletedProcess, float]:
    """Run `child` with a 1 s shutdown deadline; it prints the time its exit starts.
    Returns the process and how long its exit took."""
    env = {**os.environ, "CHIPTRACE_SHUTDOWN_TIMEOUT": "1"}
    proc = subprocess.run(
        [sys.executable, "-c", child, *args], env=env, capture_output=True, text=True, timeout=60
    )
    ended = time.monotonic()
    assert proc.returncode == 0, proc.stderr
    return proc, ended - float(proc.stdout)


def test_what_a_slow_exporter_leaves_at_exit_is_counted(tmp_path: Path) -> None:
    out = tmp_path / "t"
    proc, took = _exit_with_deadline(_SLOW_CHILD, str(out))
    assert took < 5  # the deadline (1 s), not the ~10 s of exporting
    assert "did not finish writing" not in proc.stderr  # the store was not what was late
    (m,) = read_manifests([out])
    assert m["spans_written"] == 10_000 and m["spans_dropped"] == 0
    # At most a few 512-span calls went out within the second; the rest are counted.
    assert 10_000 - 4 * 512 <= m["sink_spans_dropped"] <= 10_000


_OTLP_CHILD = textwrap.dedent(
    """
    import sys, time, chiptrace

    chiptrace.init(sys.argv[1], otlp_endpoint=sys.argv[2], flush_interval_s=0.1)
    for _ in range(3):
        for _ in range(1000):
            with chiptrace.span("work"):
                pass
        time.sleep(0.2)
    print(time.monotonic(), flush=True)
    """
)


def test_an_otlp_endpoint_that_never_answers_costs_exit_the_deadline(tmp_path: Path) -> None:
    import socket

    out = tmp_path / "t"
    with socket.socket() as silent:  # takes connections, never answers a request
        silent.bind(("127.0.0.1", 0))
        silent.listen(64)
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        proc, took = _exit_with_deadline(_OTLP_CHILD, str(out), url)
    assert took < 5  # the deadline, not the endpoint's silence
    (m,) = read_manifests([out])
    # Every span is in the store, and none reached the endpoint: all counted, the batch
    # stuck in its send included (it went uncounted).
    assert m["spans_written"] == 3000 and m["sink_spans_dropped"] == 3000
