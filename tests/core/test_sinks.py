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
