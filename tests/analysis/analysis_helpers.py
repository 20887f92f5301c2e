"""Helpers for analysis tests: small real trace dirs built span by span in tmp_path."""

from __future__ import annotations

import contextlib
import itertools
import re
import signal
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from chiptrace.schema import batch_from_columns, ids_to_binary, trace_ids_to_binary
from chiptrace.store import PartWriter

US = 1_000
MS = 1_000_000
T0 = 1_700_000_000_000_000_000


class TraceBuilder:
    """Collects spans (times in us from T0) and writes them as one Parquet part."""

    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []
        self._ids = itertools.count(1)
        self._traces = itertools.count(1)

    def new_trace(self) -> bytes:
        return next(self._traces).to_bytes(16, "big")

    def span(
        self,
        name: str,
        start_us: float,
        end_us: float,
        *,
        trace: bytes,
        parent: int | None = None,
        chip: str | None = None,
        link: str | None = None,
        src: str | None = None,
        dst: str | None = None,
        op: str | None = None,
        nbytes: int | None = None,
        flops: int | None = None,
        precision: str | None = None,
        links: list[int] | None = None,
    ) -> int:
        sid = next(self._ids)
        chip_type = chip.split(":")[0] if chip else None
        link_type = link.split(":")[0] if link else None
        if op is None:
            op = "comm" if link else ("compute" if chip else None)
        self.rows.append(
            {
                "trace_id": trace,
                "span_id": sid,
                "parent_span_id": parent or 0,
                "name": name,
                "start_ns": T0 + int(start_us * US),
                "end_ns": T0 + int(end_us * US),
                "chip_id": chip,
                "chip_type": chip_type,
                "link_id": link,
                "link_type": link_type,
                "link_src": src,
                "link_dst": dst,
                "op_kind": op,
                "op_bytes": nbytes,
                "op_flops": flops,
                "op_precision": precision,
                "links": None
                if not links
                else "["
                + ",".join(
                    f'{{"trace_id":"{trace.hex()}","span_id":"{i:016x}","attributes":{{}}}}'
                    for i in links
                )
                + "]",
            }
        )
        return sid

    def write(self, directory: Path, manifest: Mapping[str, Any] | None = None) -> Path:
        cols: dict[str, Any] = {}
        for key in self.rows[0]:
            cols[key] = [r[key] for r in self.rows]
        cols["trace_id"] = trace_ids_to_binary(cols["trace_id"])
        cols["span_id"] = ids_to_binary(cols["span_id"])
        cols["parent_span_id"] = ids_to_binary(cols["parent_span_id"], zero_is_null=True)
        writer = PartWriter(directory, manifest={"run_id": "test", **(manifest or {})})
        writer.write(batch_from_columns(cols))
        writer.write_manifest()
        return directory


def training_run(
    directory: Path,
    *,
    steps: int = 4,
    gpus: int = 4,
    layers: int = 4,
    slow_gpu: str | None = None,
    late_gpu: str | None = None,
    slow_link: str | None = None,
    dpu_us: float = 20,
    cpu_optimizer_us: float | None = None,
    message_bytes: int = 8 << 20,
    overlap: bool = True,
    precision: str = "fp8",
    dropped: int = 0,
) -> Path:
    """A small data-parallel training trace, computed by hand (not the emulator): DPU
    preprocessing, host-to-device copies, forward/backward per layer on each GPU, a ring
    all-reduce per bucket over NVLink (overlapped with backward, or after it), optimizer on
    the GPUs or on cpu:0. Each knob injects one fault."""
    b = TraceBuilder()
    bw, lat = 900e9, 2.5  # bytes/s, us
    topo = {
        "chips": [
            {
                "id": f"gpu:{g}",
                "type": "gpu",
                "memory_bandwidth_Bps": 8e12,
                "peak_flops": {"bf16": 1e15, "fp16": 1e15, "fp8": 2e15, "nvfp4": 4e15},
            }
            for g in range(gpus)
        ],
        "links": [
            {
                "id": f"nvlink5:gpu:{g}-gpu:{(g + 1) % gpus}",
                "type": "nvlink5",
                "bandwidth_Bps": bw,
                "latency_ns": lat * 1000,
            }
            for g in range(gpus)
        ],
    }
    t0 = 0.0
    n_msgs = max(1, (8 << 20) // message_bytes)
    for _ in range(steps):
        t = b.new_trace()
        spans_before = len(b.rows)
        root = b.span("train_step", t0, t0, trace=t)
        pre = b.span("preprocess", t0, t0 + dpu_us, trace=t, parent=root, chip="dpu:0")
        ready = t0 + dpu_us
        bucket_ready: list[list[float]] = [[0.0] * gpus for _ in range(layers)]
        for g in range(gpus):
            chip = f"gpu:{g}"
            speed = 4.0 if chip == slow_gpu else 1.0
            c = ready + (30 if chip == late_gpu else 0)
            h2d = b.span(
                "h2d",
                c,
                c + 5,
                trace=t,
                parent=root,
                link=f"pcie5:cpu:0-{chip}",
                src="cpu:0",
                dst=chip,
                nbytes=1 << 20,
                links=[pre],
            )
            c += 5
            for i in range(layers):
                d = 10 * speed
                b.span(
                    "fwd",
                    c,
                    c + d,
                    trace=t,
                    parent=root,
                    chip=chip,
                    flops=int(1e10),
                    nbytes=1 << 20,
                    precision=precision,
                    links=[h2d] if i == 0 else None,
                )
                c += d
            for i in range(layers):
                d = 20 * speed
                b.span(
                    "bwd",
                    c,
                    c + d,
                    trace=t,
                    parent=root,
                    chip=chip,
                    flops=int(2e10),
                    nbytes=2 << 20,
                    precision=precision,
                )
                c += d
                bucket_ready[i][g] = c
        last_bwd = max(max(r) for r in bucket_ready)
        ar_end = 0.0
        for i in range(layers):
            s = max(bucket_ready[i]) if overlap else last_bwd
            s = max(s, ar_end)
            for _m in range(n_msgs):
                dur = 0.0
                for g in range(gpus):
                    link = f"nvlink5:gpu:{g}-gpu:{(g + 1) % gpus}"
                    d = lat + message_bytes / (bw * (0.1 if link == slow_link else 1.0)) * 1e6
                    b.span(
                        "allreduce",
                        s,
                        s + d,
                        trace=t,
                        parent=root,
                        link=link,
                        src=f"gpu:{g}",
                        dst=f"gpu:{(g + 1) % gpus}",
                        nbytes=message_bytes,
                    )
                    dur = max(dur, d)
                s += dur
            ar_end = s
        end = max(ar_end, last_bwd)
        if cpu_optimizer_us:
            b.span("optimizer", end, end + cpu_optimizer_us, trace=t, parent=root, chip="cpu:0")
            end += cpu_optimizer_us
        else:
            for g in range(gpus):
                b.span(
                    "optimizer",
                    end,
                    end + 5,
                    trace=t,
                    parent=root,
                    chip=f"gpu:{g}",
                    flops=int(1e8),
                    nbytes=64 << 20,
                    precision="fp32",
                )
            end += 5
        b.rows[spans_before]["end_ns"] = T0 + int(end * US)
        t0 = end + 10
    return b.write(directory, {"topology": topo, "spans_dropped": dropped})


@contextlib.contextmanager
def collector(out: Path) -> Iterator[str]:
    """`chiptrace collect --listen 127.0.0.1:0 --out OUT` in its own process; yields its
    OTLP/HTTP traces URL (read from its first line), then stops it with SIGTERM, which
    stores every acknowledged span before it exits 0."""
    argv = [sys.executable, "-m", "chiptrace", "collect", "--listen", "127.0.0.1:0"]
    proc = subprocess.Popen(
        [*argv, "--out", str(out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        line = proc.stdout.readline() if proc.stdout else ""
        found = re.search(r"http://\S+/v1/traces", line)
        assert found, f"no URL in {line!r}"
        yield found.group()
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-2000:]
