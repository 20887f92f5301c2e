"""Fixtures for exporter tests: real trace dirs, a real OTLP receiver in another process."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.trace import SpanKind, Status, StatusCode

import chiptrace
from chiptrace.schema import batch_from_columns, ids_to_binary, trace_ids_to_binary
from chiptrace.store import PartWriter

RECEIVER = Path(__file__).with_name("otlp_receiver.py")


class Receiver:
    """Handle on otlp_receiver.py running as a child process."""

    def __init__(self, tmp: Path, *args: str) -> None:
        self.out = tmp / f"received-{time.monotonic_ns()}.bin"
        self.proc = subprocess.Popen(
            [sys.executable, str(RECEIVER), "--out", str(self.out), *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        ports = json.loads(self.proc.stdout.readline())
        self.http_port, self.grpc_port = ports["http"], ports["grpc"]
        self.http_url = f"http://127.0.0.1:{self.http_port}"
        self.grpc_url = f"grpc://127.0.0.1:{self.grpc_port}"

    def stats(self) -> dict[str, Any]:
        with urllib.request.urlopen(f"{self.http_url}/stats", timeout=60) as resp:
            return json.loads(resp.read())

    def requests(self) -> list[ExportTraceServiceRequest]:
        data = self.out.read_bytes() if self.out.exists() else b""
        out, pos = [], 0
        while pos < len(data):
            (n,) = struct.unpack_from("<I", data, pos)
            out.append(ExportTraceServiceRequest.FromString(data[pos + 4 : pos + 4 + n]))
            pos += 4 + n
        return out

    def spans(self) -> list[tuple[Any, Any, Any]]:
        """(resource, scope, span) for every received span."""
        return [
            (rs.resource, ss.scope, sp)
            for req in self.requests()
            for rs in req.resource_spans
            for ss in rs.scope_spans
            for sp in ss.spans
        ]

    def stop(self) -> None:
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def receiver(tmp_path: Path) -> Iterator[Receiver]:
    r = Receiver(tmp_path)
    yield r
    r.stop()


@pytest.fixture
def flaky_receiver(tmp_path: Path) -> Iterator[Receiver]:
    """Answers the first 2 HTTP requests 503 and the first 2 gRPC calls UNAVAILABLE."""
    r = Receiver(tmp_path, "--fail-first", "2")
    yield r
    r.stop()


def _decorated_workload() -> None:
    """Spans of every shape: nesting, chips, links, typed attributes, events, links, errors."""

    @chiptrace.trace(chip="gpu:0", precision="bf16", attributes={"op.flops": 2**40, "layer": 3})
    def matmul(i: int) -> None:
        chiptrace.current_span().set_attribute("ratio", 0.25 * i)

    @chiptrace.trace(link="nvlink6:gpu:0-gpu:1", attributes={"op.bytes": 64_000_000})
    def allreduce() -> None:
        pass

    with chiptrace.span(
        "step", kind=SpanKind.SERVER, attributes={"tags": ["a", "b"], "ok": True}
    ) as step:
        step.add_event("begin", {"n": 1, "what": "x"})
        for i in range(3):
            matmul(i)
        allreduce()
        with chiptrace.span("load", chip="cpu:0", op="io") as load:
            load.add_link(step.get_span_context(), {"why": "feeds"})
    with chiptrace.span("bad", chip="dpu:1") as bad:
        bad.set_status(Status(StatusCode.ERROR, "disk on fire"))


def write_other_part(directory: Path) -> int:
    """A second writer's part with another resource and scope (a collected service)."""
    n = 4
    batch = batch_from_columns(
        {
            "trace_id": trace_ids_to_binary([bytes([7]) * 16] * n),
            "span_id": ids_to_binary([11, 12, 13, 14]),
            "parent_span_id": ids_to_binary([0, 11, 11, 12], zero_is_null=True),
            "name": ["req", "send", "recv", "copy"],
            "kind": [2, 3, 1, 1],
            "start_ns": [1_000, 1_100, 1_200, 1_150],
            "end_ns": [2_000, 1_500, 1_900, 1_300],
            "link_id": [None, "ethernet:nic:0-nic:1", None, "pcie5:cpu:0-gpu:0"],
            "link_type": [None, "ethernet", None, "pcie5"],
            "chip_id": [None, None, "nic:1", None],
            "op_bytes": [None, 1 << 20, None, 4096],
            "service": "remote",
            "host": "node2",
            "pid": 42,
            "scope": ["io.remote", "io.remote", "io.other", "io.remote"],
            "resource": json.dumps({"service.name": "remote", "host.name": "node2", "k8s.pod": 7}),
            "attributes": [None, json.dumps({"x": {"nested": [1, 2.5, "s"]}}), None, None],
        }
    )
    writer = PartWriter(directory, manifest={"service": "remote"})
    writer.write(batch)
    writer.write_manifest()
    return n


@pytest.fixture
def code_trace(tmp_path: Path) -> Iterator[Path]:
    """A trace dir from decorated code plus a second writer's part: 11 spans, 3 traces."""
    out = tmp_path / "trace"
    chiptrace.init(
        out,
        service="trainer",
        resource={"deployment.environment": "test", "rank": 0},
        flush_interval_s=60,
    )
    _decorated_workload()
    chiptrace.shutdown()
    write_other_part(out)
    yield out


def stored_rows(directory: Path, where: str = "true") -> list[dict[str, Any]]:
    con = chiptrace.connect(directory)
    return con.sql(f"SELECT * FROM spans_raw WHERE {where}").to_arrow_table().to_pylist()


def stored_table(directory: Path) -> pa.Table:
    return chiptrace.connect(directory).sql("SELECT * FROM spans_raw").to_arrow_table()


def write_rack_trace(directory: Path) -> dict[str, int]:
    """A hand-made rack trace for layout checks; returns span name -> span id.

    gpu:0 runs `a` [0, 100) with `c` [10, 20) inside it, and `b` [50, 150) overlapping `a`
    without nesting (a second stream). `xfer` moves data over NVLink [150, 200) and feeds
    `d` on gpu:1 through a link; `e` runs on gpu:1 as a child of the transfer.
    """
    names = ["a", "c", "b", "xfer", "d", "e"]
    ids = {n: i + 1 for i, n in enumerate(names)}
    t0 = 1_800_000_000_000_000_000
    starts = [0, 10, 50, 150, 210, 205]
    ends = [100, 20, 150, 200, 300, 209]
    batch = batch_from_columns(
        {
            "trace_id": trace_ids_to_binary([bytes([9]) * 16] * 6),
            "span_id": ids_to_binary([ids[n] for n in names]),
            "parent_span_id": ids_to_binary([0, ids["a"], 0, 0, 0, ids["xfer"]], zero_is_null=True),
            "name": names,
            "start_ns": [t0 + s * 1000 + 7 for s in starts],
            "end_ns": [t0 + e * 1000 + 7 for e in ends],
            "chip_id": ["gpu:0", "gpu:0", "gpu:0", None, "gpu:1", "gpu:1"],
            "chip_type": ["gpu", "gpu", "gpu", None, "gpu", "gpu"],
            "link_id": [None, None, None, "nvlink6:gpu:0-gpu:1", None, None],
            "link_type": [None, None, None, "nvlink6", None, None],
            "op_kind": ["compute", "compute", "compute", "comm", "compute", "compute"],
            "op_bytes": [None, None, None, 1 << 30, None, None],
            "service": "rack",
            "host": "node1",
            "pid": 1,
            "scope": "chiptrace.emulator",
            "resource": json.dumps({"service.name": "rack"}),
            "links": [
                None,
                None,
                None,
                None,
                json.dumps(
                    [{"trace_id": "09" * 16, "span_id": f"{ids['xfer']:016x}", "attributes": {}}]
                ),
                None,
            ],
        }
    )
    PartWriter(directory).write(batch)
    return ids
