"""The span object and its hot path: open, finish, and the process-wide state they read.

A chiptrace span lives in OpenTelemetry's own context, so it nests with spans from any
other OpenTelemetry instrumentation in both directions. When it ends, the span object
itself is appended to the recorder's deque; everything costlier happens on the writer
thread. The hot path is deliberately flat: each call costs about a microsecond, and
every extra Python call level costs about 0.05 us of that.
"""

from __future__ import annotations

import logging
import os
import random
import threading
import time
import traceback
from collections.abc import Callable, Mapping
from contextvars import ContextVar
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace as otel_trace
from opentelemetry.context import Context
from opentelemetry.trace import SpanContext, Status, StatusCode, TraceFlags
from opentelemetry.trace.propagation import _SPAN_KEY

from chiptrace import config as _config
from chiptrace._traceparent import remote_parent_from_env
from chiptrace.errors import ConfigError
from chiptrace.recorder import Recorder
from chiptrace.schema import (
    SPAN_KIND_CLIENT,
    SPAN_KIND_CONSUMER,
    SPAN_KIND_INTERNAL,
    SPAN_KIND_PRODUCER,
    SPAN_KIND_SERVER,
    STATUS_ERROR,
    STATUS_OK,
    STATUS_UNSET,
    Tags,
)

_time_ns = time.time_ns
_rng = random.Random()
_randbits = _rng.getrandbits
# A forked child must not replay its parent's id sequence.
os.register_at_fork(after_in_child=_rng.seed)

_runtime = otel_context._RUNTIME_CONTEXT
_var: ContextVar[Context] | None = getattr(_runtime, "_current_context", None)
_get_context: Callable[[], Context]
_set_context: Callable[[Context], Any]  # returns a token for _reset_context
_reset_context: Callable[[Any], None]
if isinstance(_var, ContextVar):
    _get_context, _set_context, _reset_context = _var.get, _var.set, _var.reset
else:  # a custom OTEL_PYTHON_CONTEXT runtime: go through its public surface
    _get_context, _set_context, _reset_context = (
        _runtime.get_current,
        _runtime.attach,
        _runtime.detach,
    )

_KINDS = {
    otel_trace.SpanKind.INTERNAL: SPAN_KIND_INTERNAL,
    otel_trace.SpanKind.SERVER: SPAN_KIND_SERVER,
    otel_trace.SpanKind.CLIENT: SPAN_KIND_CLIENT,
    otel_trace.SpanKind.PRODUCER: SPAN_KIND_PRODUCER,
    otel_trace.SpanKind.CONSUMER: SPAN_KIND_CONSUMER,
}
_SAMPLED = TraceFlags(TraceFlags.SAMPLED)


class _State:
    """Process-wide tracing state; one instance, read on every call."""

    enabled: bool = True
    recorder: Recorder | None = None
    sampler: Any = None  # chiptrace.host.HostSampler when init(sample_host=True)
    lock = threading.Lock()
    # (trace id, span id) from TRACEPARENT: the parent of this process's root spans.
    remote_root: tuple[bytes, int] | None = None
    # The recorder config a forked child inherits (it writes its own parts, same dir).
    fork_config: _config.Config | None = None
    # Starts a recorder from the environment on the first span without init()
    # (set by chiptrace.lifecycle, which owns configuration).
    auto_init: Callable[[], Recorder | None] = staticmethod(lambda: None)


_STATE = _State()
try:
    _STATE.enabled = _config.parse_bool(
        _config.ENV_ENABLED, os.environ.get(_config.ENV_ENABLED, "1") or "1"
    )
except ConfigError:
    _STATE.enabled = True  # resolve() reports the bad value when init() runs
_STATE.remote_root = remote_parent_from_env()


class Span(otel_trace.Span):
    """A chiptrace span: an OpenTelemetry `Span` that records into the chiptrace store.

    Set attributes, add events and links while it is open, as on any OTel span.
    """

    # Only what every span needs is set per call; the rest reads the class defaults
    # below until first written (each assignment saved is ~0.02 us on the hot path).
    __slots__ = ("trace_id", "span_id", "parent_id", "name", "kind", "tags", "start_ns", "end_ns")
    start_ns: int  # set by whoever opens the span, right after construction

    attributes: dict[str, Any] | None = None
    events: list[tuple[str, int, Any]] | None = None
    links: list[tuple[bytes, int, Any]] | None = None
    status_code = STATUS_UNSET
    status_message: str | None = None

    def __init__(
        self, trace_id: bytes, span_id: int, parent_id: int, name: str, kind: int, tags: Tags
    ) -> None:
        self.trace_id = trace_id
        self.span_id = span_id
        self.parent_id = parent_id
        self.name = name
        self.kind = kind
        self.tags = tags
        self.end_ns = 0

    # OpenTelemetry Span interface -------------------------------------------------
    def get_span_context(self) -> SpanContext:
        return SpanContext(int.from_bytes(self.trace_id, "big"), self.span_id, False, _SAMPLED)

    def is_recording(self) -> bool:
        return self.end_ns == 0

    def set_attribute(self, key: str, value: Any) -> None:
        if self.end_ns:
            return _ended(self, "set_attribute")
        if self.attributes is None:
            self.attributes = {}
        self.attributes[key] = value

    def set_attributes(self, attributes: Mapping[str, Any]) -> None:
        if self.end_ns:
            return _ended(self, "set_attributes")
        if self.attributes is None:
            self.attributes = {}
        self.attributes.update(attributes)

    def add_event(
        self, name: str, attributes: Mapping[str, Any] | None = None, timestamp: int | None = None
    ) -> None:
        if self.end_ns:
            return _ended(self, "add_event")
        if self.events is None:
            self.events = []
        self.events.append(
            (name, timestamp or _time_ns(), dict(attributes) if attributes else None)
        )

    def add_link(self, context: SpanContext, attributes: Mapping[str, Any] | None = None) -> None:
        if self.end_ns:
            return _ended(self, "add_link")
        if context is None or not context.is_valid:
            return
        if self.links is None:
            self.links = []
        self.links.append(
            (context.trace_id.to_bytes(16, "big"), context.span_id, dict(attributes or {}))
        )

    def update_name(self, name: str) -> None:
        if self.end_ns:
            return _ended(self, "update_name")
        self.name = name

    def set_status(self, status: Status | StatusCode, description: str | None = None) -> None:
        if self.end_ns:
            return _ended(self, "set_status")
        if isinstance(status, Status):
            code, description = status.status_code, status.description or description
        else:
            code = status
        if self.status_code == STATUS_OK:  # OTel: OK is final
            return
        self.status_code = {StatusCode.OK: STATUS_OK, StatusCode.ERROR: STATUS_ERROR}.get(
            code, STATUS_UNSET
        )
        self.status_message = description if code == StatusCode.ERROR else None

    def record_exception(
        self,
        exception: BaseException,
        attributes: Mapping[str, Any] | None = None,
        timestamp: int | None = None,
        escaped: bool = False,
    ) -> None:
        attrs = {
            "exception.type": type(exception).__qualname__,
            "exception.message": str(exception),
            "exception.stacktrace": "".join(
                traceback.format_exception(type(exception), exception, exception.__traceback__)
            ),
            "exception.escaped": escaped,
        }
        attrs.update(attributes or {})
        self.add_event("exception", attrs, timestamp)

    def end(self, end_time: int | None = None) -> None:
        _finish(self, end_time)

    def _fail(self, exc: BaseException) -> None:
        if isinstance(exc, GeneratorExit):
            return
        self.status_code = STATUS_ERROR
        self.status_message = f"{type(exc).__qualname__}: {exc}"
        self.record_exception(exc, escaped=True)


_warned_ended = False


def _ended(span: Span, what: str) -> None:
    """A write to an ended span is ignored, with one warning per process (as the
    OpenTelemetry SDK does): the writer thread may be reading the span already."""
    global _warned_ended
    if span.end_ns > 0 and not _warned_ended:  # -1: never recorded (tracing disabled)
        _warned_ended = True
        logging.getLogger("chiptrace").warning(
            "chiptrace: %s on ended span %r ignored (further such writes are ignored silently)",
            what,
            span.name,
        )


def _open(name: str, tags: Tags, kind: int) -> tuple[Span, Any]:
    ctx = _get_context()
    parent: Any = ctx.get(_SPAN_KEY)  # ours, None, or any OpenTelemetry span
    if parent.__class__ is Span:
        trace_id, parent_id = parent.trace_id, parent.span_id
    elif parent is None:
        # A root here may still be a child: of the span that launched this process.
        trace_id, parent_id = _STATE.remote_root or (_randbits(128).to_bytes(16, "big"), 0)
    else:  # a span from the OpenTelemetry SDK or another instrumentation
        sc = parent.get_span_context()
        if sc.is_valid:
            trace_id, parent_id = sc.trace_id.to_bytes(16, "big"), sc.span_id
        else:
            trace_id, parent_id = _randbits(128).to_bytes(16, "big"), 0
    span = Span(trace_id, _randbits(64) or 1, parent_id, name, kind, tags)
    token = _set_context(Context({**ctx, _SPAN_KEY: span}))
    span.start_ns = _time_ns()
    return span, token


def _finish(span: Span, end_ns: int | None = None) -> None:
    if span.end_ns:
        return
    span.end_ns = end_ns or _time_ns()
    rec = _STATE.recorder or _STATE.auto_init()
    if rec is None:
        return
    # The span object itself is the buffered row: the writer thread reads its fields.
    rows = rec.rows
    if len(rows) < rec.max_buffered:
        rows.append(span)
    else:
        rec.drop()


def _close(span: Span, token: Any) -> None:
    try:
        _reset_context(token)
    except ValueError:
        pass  # the token belongs to another context (a task or thread took over); harmless
    _finish(span)
