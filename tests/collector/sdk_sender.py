"""Sends spans with the real OpenTelemetry SDK and its OTLP exporter; prints what it sent.

    python3 sdk_sender.py (--http URL | --grpc HOST:PORT) [--spans N] [--gzip]

Prints one JSON list: per span its hex ids, parent, times, name, kind and attributes,
read from an in-memory exporter fed by the same TracerProvider.
"""

from __future__ import annotations

import argparse
import json

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--http")
    ap.add_argument("--grpc")
    ap.add_argument("--spans", type=int, default=50)
    ap.add_argument("--gzip", action="store_true")
    args = ap.parse_args()
    if args.http:
        from opentelemetry.exporter.otlp.proto.http import Compression
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        exporter = OTLPSpanExporter(
            endpoint=args.http, timeout=60, compression=Compression.Gzip if args.gzip else None
        )
    else:
        from grpc import Compression
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        exporter = OTLPSpanExporter(
            endpoint=args.grpc,
            insecure=True,
            timeout=60,
            compression=Compression.Gzip if args.gzip else None,
        )
    memory = InMemorySpanExporter()
    tp = TracerProvider(
        resource=Resource({"service.name": "sdk-app", "host.name": "node7", "process.pid": 4242})
    )
    tp.add_span_processor(BatchSpanProcessor(exporter, max_export_batch_size=64))
    tp.add_span_processor(SimpleSpanProcessor(memory))
    tracer = tp.get_tracer("sdk.lib")
    with tracer.start_as_current_span("job", kind=SpanKind.SERVER) as job:
        for i in range(args.spans - 1):
            attrs = {
                "chip.id": f"gpu:{i % 4}",
                "chip.type": "gpu",
                "op.flops": i * 1000,
                "rank": i % 4,
                "loss": 0.5 / (i + 1),
                "tags": ["a", "b"],
                "ok": i % 2 == 0,
            }
            with tracer.start_as_current_span(f"op{i % 3}", attributes=attrs) as s:
                if i % 10 == 0:
                    s.add_event("checkpoint", {"step": i})
                    s.add_link(job.get_span_context(), {"why": "test"})
    tp.shutdown()
    out = []
    for s in memory.get_finished_spans():
        out.append(
            {
                "trace_id": f"{s.context.trace_id:032x}",
                "span_id": f"{s.context.span_id:016x}",
                "parent": f"{s.parent.span_id:016x}" if s.parent else None,
                "start": s.start_time,
                "end": s.end_time,
                "name": s.name,
                "kind": s.kind.value,
                "attributes": {
                    k: list(v) if isinstance(v, tuple) else v for k, v in s.attributes.items()
                },
                "events": [[e.name, e.timestamp, dict(e.attributes)] for e in s.events],
                "links": [[f"{lk.context.span_id:016x}", dict(lk.attributes)] for lk in s.links],
            }
        )
    print(json.dumps(out))


if __name__ == "__main__":
    main()
