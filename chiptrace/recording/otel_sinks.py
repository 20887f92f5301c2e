"""Bridges from stored span columns to OpenTelemetry SDK objects.

The store is columnar; the SDK's exporters want `ReadableSpan` objects. Building them
costs tens of microseconds a span, so this path is for user-supplied exporters and for
comparison benchmarks; chiptrace's own exporters encode straight from columns.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags

from chiptrace import _attributes as A
from chiptrace.config import Config

log = logging.getLogger("chiptrace")

_KIND = {
    0: SpanKind.INTERNAL,
    1: SpanKind.INTERNAL,
    2: SpanKind.SERVER,
    3: SpanKind.CLIENT,
    4: SpanKind.PRODUCER,
    5: SpanKind.CONSUMER,
}
_STATUS = {0: StatusCode.UNSET, 1: StatusCode.OK, 2: StatusCode.ERROR}
_FLAGS = TraceFlags(TraceFlags.SAMPLED)


def batch_to_readable_spans(batch: pa.RecordBatch | pa.Table) -> Iterator[ReadableSpan]:
    """Rebuild SDK `ReadableSpan`s from a span batch, ids and times exactly as stored."""
    resources: dict[str, Resource] = {}
    scopes: dict[str, InstrumentationScope] = {}
    for row in batch.to_pylist():
        trace_id = int.from_bytes(row["trace_id"], "big")
        ctx = SpanContext(trace_id, int.from_bytes(row["span_id"], "big"), False, _FLAGS)
        parent = None
        if row["parent_span_id"] is not None:
            parent = SpanContext(
                trace_id, int.from_bytes(row["parent_span_id"], "big"), False, _FLAGS
            )
        res_text = row["resource"] or "{}"
        if res_text not in resources:
            resources[res_text] = Resource(json.loads(res_text))
        scope_name = row["scope"] or "chiptrace"
        if scope_name not in scopes:
            scopes[scope_name] = InstrumentationScope(scope_name)
        events = [Event(e["name"], e.get("attributes") or {}, e["time_ns"]) for e in A.events(row)]
        links = [
            Link(
                SpanContext(int(lk["trace_id"], 16), int(lk["span_id"], 16), False, _FLAGS),
                lk["attributes"],
            )
            for lk in A.links(row)
        ]
        yield ReadableSpan(
            name=row["name"],
            context=ctx,
            parent=parent,
            resource=resources[res_text],
            attributes=A.attributes(row),
            events=events,
            links=links,
            kind=_KIND.get(row["kind"], SpanKind.INTERNAL),
            status=Status(_STATUS.get(row["status_code"], StatusCode.UNSET), row["status_message"]),
            start_time=row["start_ns"],
            end_time=row["end_ns"],
            instrumentation_scope=scopes[scope_name],
        )


class ExportFailed(RuntimeError):
    """An export failed; the first `delivered` spans of the table had gone out."""

    def __init__(self, message: str, delivered: int) -> None:
        super().__init__(message)
        self.delivered = delivered


# Spans per export() call: the SDK's OTEL_BSP_MAX_EXPORT_BATCH_SIZE default.
EXPORT_BATCH_SPANS = 512


class ExporterSink:
    """Feeds any OpenTelemetry `SpanExporter`, on a thread of its own (lifecycle wraps it
    in chiptrace.recording.sink_queue.QueuedSink), in calls of EXPORT_BATCH_SPANS spans."""

    def __init__(self, exporter: Any, config: Config | None = None) -> None:
        self.exporter = exporter

    def write(self, batch: pa.RecordBatch | pa.Table) -> None:
        """Export in calls of EXPORT_BATCH_SPANS; the first failure ends the table.

        Raises:
            ExportFailed: an export raised or did not return SUCCESS; `delivered` says
                how many of the table's spans the exporter had taken by then.
        """
        name = type(self.exporter).__name__
        for start in range(0, batch.num_rows, EXPORT_BATCH_SPANS):
            part = batch.slice(start, EXPORT_BATCH_SPANS)
            try:
                result = self.exporter.export(list(batch_to_readable_spans(part)))
            except Exception as e:  # noqa: BLE001 - the queue counts it and logs it once
                raise ExportFailed(f"{name} raised {e!r}", start) from e
            if getattr(result, "name", "SUCCESS") != "SUCCESS":
                raise ExportFailed(f"{name} returned {getattr(result, 'name', result)}", start)

    def close(self) -> None:
        self.exporter.shutdown()


def sdk_otlp_sink(config: Config) -> ExporterSink:
    """The OpenTelemetry SDK's OTLP/HTTP exporter as a sink for `init(otlp_endpoint=...)`.

    The fallback: chiptrace/__init__.py registers chiptrace's columnar OTLP encoder
    (lifecycle.EXTENSIONS), which the core does not import.
    """
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    endpoint = (config.otlp_endpoint or "").rstrip("/")
    if not endpoint.endswith("/v1/traces"):
        endpoint += "/v1/traces"
    return ExporterSink(OTLPSpanExporter(endpoint=endpoint), config)
