"""Bounded memory: a flood of requests, each with one unique 10 MB attribute, keeps
`chiptrace collect` under its documented ceiling (--max-memory-mb, default 1024).

Measured as the process's peak resident set (VmHWM, Linux), sampled until it exits, so
the final flush after SIGTERM counts too. Before the bound, 80 such requests took RSS to
4.6 GB. A load test: ~800 MB through loopback, about 20 s on 2 cores; it runs with
CHIPTRACE_LOAD_TESTS=1 (CI's load step), and is skipped otherwise.
"""

from __future__ import annotations

import os
import signal
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from tests.collector.test_collect import start_collect, stored

pytestmark = [
    pytest.mark.load,
    pytest.mark.skipif(
        not os.environ.get("CHIPTRACE_LOAD_TESTS"), reason="load test: set CHIPTRACE_LOAD_TESTS=1"
    ),
    pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads /proc (Linux)"),
]

REQUESTS = 80
VALUE_BYTES = 10 << 20
CEILING = 1 << 30


def big_request(i: int) -> bytes:
    req = ExportTraceServiceRequest()
    span = req.resource_spans.add().scope_spans.add().spans.add()
    span.trace_id, span.span_id, span.name = os.urandom(16), i.to_bytes(8, "big"), "big"
    span.start_time_unix_nano, span.end_time_unix_nano = 1, 2
    kv = span.attributes.add()
    kv.key, kv.value.string_value = "blob", f"{i:08d}".ljust(VALUE_BYTES, "x")
    return req.SerializeToString()


def peak_rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) << 10
    raise AssertionError("no VmHWM")


def test_a_flood_of_10mb_attributes_stays_under_the_memory_ceiling(tmp_path: Path) -> None:
    out = tmp_path / "flood"
    proc, url = start_collect(out, "--flush-interval", "0.5")
    peak = [0]

    def sample() -> None:
        while proc.poll() is None:
            try:
                peak[0] = max(peak[0], peak_rss(proc.pid))
            except (OSError, AssertionError):
                return
            time.sleep(0.05)

    sampler = threading.Thread(target=sample)
    sampler.start()
    todo = list(range(1, REQUESTS + 1))
    acked: list[int] = []
    refused = [0]
    lock = threading.Lock()

    def client() -> None:
        while True:
            with lock:
                if not todo:
                    return
                i = todo.pop()
            body = big_request(i)
            for _ in range(100):  # as an OTLP client does: retry 503 after Retry-After
                req = urllib.request.Request(
                    url, data=body, headers={"Content-Type": "application/x-protobuf"}
                )
                try:
                    with urllib.request.urlopen(req, timeout=120):
                        acked.append(i)
                        break
                except urllib.error.HTTPError as e:
                    assert e.code == 503, e.read()
                    refused[0] += 1
                    time.sleep(min(float(e.headers["Retry-After"]), 0.5))

    clients = [threading.Thread(target=client) for _ in range(16)]
    for t in clients:
        t.start()
    for t in clients:
        t.join()
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=300)
    sampler.join()
    assert proc.returncode == 0, err[-2000:]
    assert sorted(acked) == list(range(1, REQUESTS + 1))
    assert len(stored(out)) == REQUESTS
    assert 0 < peak[0] <= CEILING, f"peak RSS {peak[0] >> 20} MiB, {refused[0]} refusals"
