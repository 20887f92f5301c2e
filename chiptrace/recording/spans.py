"""The span objects and their hot path: open, finish, and the process-wide state they read.

A chiptrace span lives in OpenTelemetry's own context variable, so it nests with spans
from any other OpenTelemetry instrumentation in both directions; the contexts chiptrace
sets are plain dicts (OpenTelemetry reads them with `.get`, as it reads its own).

When a span ends it becomes a row, a tuple of ints (chiptrace.recording.fastrows) or, when it
carries attributes, events or a status, a general row (chiptrace.recording.rows); the span object
itself is not kept. A decorated function's span (chiptrace.recording.wrappers) is smaller still: a
`Live` tuple of its ids, made only so that children and OpenTelemetry can find it.

Ids: span ids come from a per-process counter started at a random point (unique in the
process, never 0); a root span's trace id is a per-process random high half and the root
span id as the low half, so a root costs no second random number.
"""

from __future__ import annotations

import itertools
import logging
import os
import random
import threading
import time
import traceback
from collections.abc import Callable, Mapping
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

from opentelemetry import context as otel_context
from opentelemetry import trace as otel_trace
from opentelemetry.trace import SpanContext, Status, StatusCode, TraceFlags
from opentelemetry.trace.propagation import _SPAN_KEY

from chiptrace import config as _config
from chiptrace.errors import ConfigError
from chiptrace.recording import sites as _sites
from chiptrace.recording.traceparent import remote_parent_from_env
from chiptrace.vocab import (
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

if TYPE_CHECKING:
    from chiptrace.recorder import Recorder

_time_ns = time.time_ns
_rng = random.Random()
_randbits = _rng.getrandbits
_MASK64 = (1 << 64) - 1

# The process state as the compiled @trace wrappers read it: their globals dict, which
# chiptrace.recording binds to chiptrace.recording.wrappers (with the functions they call)
# and this module keeps current: the enabled flag and the recorder (_State's setters: ON,
# OFF, REC, REMOTE) and the id counter and trace-id high half (_reseed_ids: new_id, HI).
WRAPPER_GLOBALS: dict[str, Any] = {"ON": False, "OFF": False, "REC": None, "REMOTE": None}
# Called after every change of WRAPPER_GLOBALS: the C wrappers keep a copy of it
# (chiptrace.recording.wrappers.refresh, registered by chiptrace.recording).
_ON_CHANGE: list[Callable[[], None]] = []


def on_globals_change(fn: Callable[[], None]) -> None:
    """Call `fn` after every change of WRAPPER_GLOBALS (and once now)."""
    _ON_CHANGE.append(fn)
    fn()


def _changed() -> None:
    for fn in _ON_CHANGE:
        fn()


def _reseed_ids() -> None:
    """A new id counter and trace-id high half (at import, and in a forked child, which
    must not replay its parent's ids)."""
    global _new_id, _TRACE_HI
    _rng.seed()
    # Started below 2**63: a process would need 2**62 spans to reach the end of the range.
    _new_id = itertools.count(_randbits(62) + 1).__next__
    _TRACE_HI = _randbits(64) or 1
    WRAPPER_GLOBALS.update(new_id=_new_id, HI=_TRACE_HI)
    _changed()


_new_id: Callable[[], int]
_TRACE_HI: int
_reseed_ids()


def new_span_id() -> int:
    """A new span id (through the module global: a fork replaces the counter)."""
    return _new_id()


os.register_at_fork(after_in_child=_reseed_ids)

_runtime = otel_context._RUNTIME_CONTEXT
_var: ContextVar[Any] | None = getattr(_runtime, "_current_context", None)
_get_context: Callable[[], Any]
_set_context: Callable[[Any], Any]  # returns a token for _reset_context
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
    """Process-wide tracing state; one instance, read on every call. `enabled` and
    `recorder` are mirrored into WRAPPER_GLOBALS, where a compiled wrapper's read is one
    cached global load."""

    _enabled: bool = True
    _recorder: Recorder | None = None
    sampler: Any = None  # chiptrace.host.HostSampler when init(sample_host=True)
    lock = threading.Lock()
    _remote_root: tuple[int, int] | None = None
    # The recorder config a forked child inherits (it writes its own parts, same dir).
    fork_config: _config.Config | None = None
    # Starts a recorder from the environment on the first span without init()
    # (set by chiptrace.lifecycle, which owns configuration).
    auto_init: Callable[[], Recorder | None] = staticmethod(lambda: None)

    @property
    def enabled(self) -> bool:
        return self._enabled

    @enabled.setter
    def enabled(self, value: bool) -> None:
        self._enabled = bool(value)
        WRAPPER_GLOBALS["OFF"] = not self._enabled
        WRAPPER_GLOBALS["ON"] = self._enabled and self._recorder is not None
        _changed()

    @property
    def remote_root(self) -> tuple[int, int] | None:
        """(trace id, span id) from TRACEPARENT: the parent of this process's root spans."""
        return self._remote_root

    @remote_root.setter
    def remote_root(self, value: tuple[int, int] | None) -> None:
        self._remote_root = value
        WRAPPER_GLOBALS["REMOTE"] = value
        _changed()

    @property
    def recorder(self) -> Recorder | None:
        return self._recorder

    @recorder.setter
    def recorder(self, value: Recorder | None) -> None:
        self._recorder = value
        WRAPPER_GLOBALS["REC"] = value
        # A decorated call sees ON false until a recorder runs, and starts one (_start)
        # before it reads its clock: chiptrace's start-up never lands inside a span.
        WRAPPER_GLOBALS["ON"] = self._enabled and value is not None
        _changed()


def _start() -> bool:
    """The first traced call without init(): start the recorder, before the span's start
    time is taken. True when spans are recorded now."""
    return (_STATE.recorder or _STATE.auto_init()) is not None


try:
    # OpenTelemetry span limits (init() sets them again from its resolved settings).
    LIMITS = _config.span_limits()
except ConfigError:
    LIMITS = _config.SpanLimits()  # resolve() reports the bad value when init() runs


# The two limits set_attribute reads on every call, as plain globals (set_limits).
_ATTRIBUTES_LIMIT = LIMITS.attributes
_VALUE_LIMIT = LIMITS.value_length


def _unchecked(limits: _config.SpanLimits) -> int:
    # Attributes given at once (span(attributes=...)) up to this many need no work: one
    # compare on span()'s path, and `bounded` only where a limit can cut something.
    return -1 if limits.value_length is not None else limits.attributes


UNCHECKED_ATTRIBUTES = _unchecked(LIMITS)


def set_limits(limits: _config.SpanLimits) -> None:
    """Apply span limits (init() calls this with its resolved settings)."""
    global LIMITS, _ATTRIBUTES_LIMIT, _VALUE_LIMIT, UNCHECKED_ATTRIBUTES
    LIMITS, _ATTRIBUTES_LIMIT, _VALUE_LIMIT = limits, limits.attributes, limits.value_length
    UNCHECKED_ATTRIBUTES = _unchecked(limits)


def bounded(attributes: Mapping[str, Any]) -> dict[str, Any]:
    """Attributes given all at once (`span(attributes=...)`, a decorator's, an event's)
    under the span limits, as the SDK bounds a span's start attributes: the first
    OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT keys, string values cut to the value length limit."""
    pairs = attributes.items() if isinstance(attributes, Mapping) else dict(attributes).items()
    items = itertools.islice(pairs, LIMITS.attributes)
    if LIMITS.value_length is None:
        return dict(items)
    return {key: _clip(value) for key, value in items}


def _clip(value: Any) -> Any:
    """A string attribute value cut to OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT (lists: each)."""
    limit = LIMITS.value_length
    if limit is None:
        return value
    if value.__class__ is str:
        return value[:limit]
    if isinstance(value, (list, tuple)):
        return [v[:limit] if v.__class__ is str else v for v in value]
    return value


_STATE = _State()
try:
    _STATE.enabled = _config.parse_bool(
        _config.ENV_ENABLED, os.environ.get(_config.ENV_ENABLED, "1") or "1"
    )
except ConfigError:
    _STATE.enabled = True  # resolve() reports the bad value when init() runs
_remote = remote_parent_from_env()
if _remote is not None:
    _STATE.remote_root = (int.from_bytes(_remote[0], "big"), _remote[1])


class Span(otel_trace.Span):
    """A chiptrace span: an OpenTelemetry `Span` that records into the chiptrace store.

    Set attributes, add events and links while it is open, as on any OTel span.
    """

    # Only what every span needs is set per call; the rest reads the class defaults
    # below until first written (each assignment saved is ~0.02 us on the hot path).
    __slots__ = (
        "trace_hi",
        "trace_lo",
        "span_id",
        "parent_id",
        "name",
        "kind",
        "tags",
        "start_ns",
        "end_ns",
        "_token",
        "_owner",
    )
    start_ns: int  # set by whoever opens the span, right after construction

    attributes: dict[str, Any] | None = None
    events: list[tuple[str, int, Any]] | None = None
    links: list[tuple[bytes, int, Any]] | None = None
    status_code = STATUS_UNSET
    status_message: str | None = None
    _token: Any  # the context token of the `with chiptrace.span(...)` entry that opened it
    _owner: Any  # that chiptrace.span object while the entry is open, else None

    def __init__(
        self,
        trace_hi: int,
        trace_lo: int,
        span_id: int,
        parent_id: int,
        name: str,
        kind: int,
        tags: Tags,
    ) -> None:
        self.trace_hi = trace_hi
        self.trace_lo = trace_lo
        self.span_id = span_id
        self.parent_id = parent_id
        self.name = name
        self.kind = kind
        self.tags = tags
        self.end_ns = 0
        self._owner = None

    @property
    def trace_id(self) -> bytes:
        """The 16-byte trace id."""
        return ((self.trace_hi << 64) | self.trace_lo).to_bytes(16, "big")

    # OpenTelemetry Span interface -------------------------------------------------
    def get_span_context(self) -> SpanContext:
        return SpanContext((self.trace_hi << 64) | self.trace_lo, self.span_id, False, _SAMPLED)

    def is_recording(self) -> bool:
        return self.end_ns == 0

    def set_attribute(self, key: str, value: Any) -> None:
        if self.end_ns:
            return _ended(self, "set_attribute")
        attrs = self.attributes
        if attrs is None:
            if _ATTRIBUTES_LIMIT:
                self.attributes = {key: value if _VALUE_LIMIT is None else _clip(value)}
            return
        if len(attrs) >= _ATTRIBUTES_LIMIT and key not in attrs:
            return  # past OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT: dropped, as the SDK does
        attrs[key] = value if _VALUE_LIMIT is None else _clip(value)

    def set_attributes(self, attributes: Mapping[str, Any]) -> None:
        if self.end_ns:
            return _ended(self, "set_attributes")
        for key, value in attributes.items():
            self.set_attribute(key, value)

    def add_event(
        self, name: str, attributes: Mapping[str, Any] | None = None, timestamp: int | None = None
    ) -> None:
        if self.end_ns:
            return _ended(self, "add_event")
        if len(self.events or ()) >= LIMITS.events:
            return  # past OTEL_SPAN_EVENT_COUNT_LIMIT (0: no events at all)
        if self.events is None:
            self.events = []
        self.events.append(
            (name, timestamp or _time_ns(), bounded(attributes) if attributes else None)
        )

    def add_link(self, context: SpanContext, attributes: Mapping[str, Any] | None = None) -> None:
        if self.end_ns:
            return _ended(self, "add_link")
        if context is None or not context.is_valid:
            return
        if len(self.links or ()) >= LIMITS.links:
            return  # past OTEL_SPAN_LINK_COUNT_LIMIT (0: no links at all)
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
            "exception.stacktrace": _stacktrace(exception),
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


# Frames of a recorded exception's stack trace: an exception that unwinds through many
# spans (a traced recursive function) is recorded by each, and the whole trace each time
# would cost the square of the depth (4,000 levels: 88 s).
STACK_FRAMES = 64


def _stacktrace(exc: BaseException) -> str:
    """The exception's trace as traceback.format_exception writes it, its first
    STACK_FRAMES frames (from the span's own call down) when it has more: the innermost
    failing span records where it was raised."""
    tb = exc.__traceback__
    if sum(1 for _ in itertools.islice(traceback.walk_tb(tb), STACK_FRAMES + 1)) <= STACK_FRAMES:
        return "".join(traceback.format_exception(type(exc), exc, tb))
    return "".join(
        [
            "Traceback (most recent call last):\n",
            *traceback.format_tb(tb, limit=STACK_FRAMES),
            "  ... deeper frames left out: the innermost failing span has them\n",
            *traceback.format_exception_only(type(exc), exc),
        ]
    )


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


def _parent_ids(parent: Any, sid: int) -> tuple[int, int, int]:
    """(trace high half, low half, parent span id) of a new span whose sid is `sid`."""
    if parent.__class__ is Span:
        return parent.trace_hi, parent.trace_lo, parent.span_id
    if isinstance(parent, tuple):
        # A decorated call's Live span (chiptrace.recording.live), the one span that is a tuple;
        # told by its shape, since _live builds on this module and is imported after it.
        return parent[0], parent[1], parent[2]
    if parent is None:
        # A root here may still be a child: of the span that launched this process.
        remote = _STATE.remote_root
        if remote is None:
            return _TRACE_HI, sid, 0
        return remote[0] >> 64, remote[0] & _MASK64, remote[1]
    sc = parent.get_span_context()  # a span from the OpenTelemetry SDK or another library
    if sc.is_valid:
        return sc.trace_id >> 64, sc.trace_id & _MASK64, sc.span_id
    return _TRACE_HI, sid, 0


def _open(name: str, tags: Tags, kind: int) -> tuple[Span, Any]:
    if _STATE._recorder is None and _STATE._enabled:
        _STATE.auto_init()  # before the start time: the start-up is not the span's
    ctx = _get_context()
    sid = _new_id()
    th, tl, pid = _parent_ids(ctx.get(_SPAN_KEY), sid)
    span = Span(th, tl, sid, pid, name, kind, tags)
    token = _set_context({**ctx, _SPAN_KEY: span})
    span.start_ns = _time_ns()
    return span, token


def _row(span: Span) -> tuple[Any, ...]:
    """The buffered row of an ended span: plain when it carries nothing but its site and
    perhaps attributes (chiptrace.recording.fastrows), else general (chiptrace.recording.rows)."""
    end = span.end_ns
    if (
        span.events is None
        and span.links is None
        and span.status_code == STATUS_UNSET
        and end.__class__ is int
    ):
        site = _sites.site(span.name, span.tags, span.kind)
        if site >= 0:
            tid_hi, tid_lo, attrs = span.trace_hi, span.trace_lo, span.attributes
            if attrs is None:
                return (site, tid_hi, tid_lo, span.span_id, span.parent_id, span.start_ns, end)
            # Flat, the keys then the values, not the dict: see chiptrace.api.span.__exit__.
            ids = (site, tid_hi, tid_lo, span.span_id, span.parent_id, span.start_ns, end)
            return (*ids, *attrs, *attrs.values())
    return general_row(span)


def general_row(span: Span) -> tuple[Any, ...]:
    """An ended span's general row (chiptrace.recording.rows), for a span no site row
    can carry: events, links, a status, or no site number (a full table)."""
    tags: Any = span.tags
    end = span.end_ns
    if tags.__class__ is _sites.RawTags:
        tags = tags[0]
    elif tags.attributes is None:
        # Its values, checked again on the writer (once per value): a row holding the Tags
        # object stays tracked by the garbage collector while buffered, and past a full
        # site table every span is such a row (a million cost ~0.6 s a full collection).
        tags = (tags.chip_id, tags.link_id, tags.op_kind, tags.op_precision)
    return (
        tags,
        span.trace_hi,
        span.trace_lo,
        span.span_id,
        span.parent_id,
        span.start_ns,
        end,
        span.name,
        span.kind,
        span.status_code,
        span.status_message,
        span.attributes,
        span.events,
        span.links,
    )


def _record(row: tuple[Any, ...]) -> None:
    rec = _STATE.recorder or _STATE.auto_init()
    if rec is not None:
        rec.record(row)


def _finish(span: Span, end_ns: int | None = None) -> None:
    if span.end_ns:
        return
    span.end_ns = end_ns or _time_ns()
    _record(_row(span))


def _close(span: Span, token: Any) -> None:
    try:
        _reset_context(token)
    except ValueError:
        pass  # the token belongs to another context (a task or thread took over); harmless
    _finish(span)
