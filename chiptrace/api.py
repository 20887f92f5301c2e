"""The instrumentation API: `@trace`, `span()`, `init()`.

A chiptrace span lives in OpenTelemetry's own context, so it nests with spans from any
other OpenTelemetry instrumentation in both directions. It is recorded as one tuple on
the recorder's deque when it ends; everything costlier happens on the writer thread.
The hot path is deliberately flat (no helper layers): each call costs about a
microsecond, and every extra Python call level costs about 0.05 us of that.
"""

from __future__ import annotations

import functools
import inspect
import logging
import multiprocessing.util
import os
import random
import threading
import time
import traceback
from collections.abc import Callable, Iterable, Mapping
from contextvars import ContextVar
from typing import Any, ParamSpec, TypeVar, overload

from opentelemetry import context as otel_context
from opentelemetry import trace as otel_trace
from opentelemetry.context import Context
from opentelemetry.trace import SpanContext, Status, StatusCode, TraceFlags
from opentelemetry.trace.propagation import _SPAN_KEY

from chiptrace import config as _config
from chiptrace.errors import ConfigError
from chiptrace.propagation import remote_parent_from_env
from chiptrace.recorder import Recorder, SpanSink, StoreSink, on_exit
from chiptrace.schema import (
    NO_TAGS,
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
from chiptrace.store import PartWriter

P = ParamSpec("P")
R = TypeVar("R")

_time_ns = time.time_ns
_rng = random.Random()
_randbits = _rng.getrandbits
# A forked child must not replay its parent's id sequence.
os.register_at_fork(after_in_child=_rng.seed)

_runtime = otel_context._RUNTIME_CONTEXT
_var: ContextVar[Context] | None = getattr(_runtime, "_current_context", None)
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
        return SpanContext(
            int.from_bytes(self.trace_id, "big"), self.span_id, False, _SAMPLED
        )

    def is_recording(self) -> bool:
        return self.end_ns == 0

    def set_attribute(self, key: str, value: Any) -> None:
        if self.attributes is None:
            self.attributes = {}
        self.attributes[key] = value

    def set_attributes(self, attributes: Mapping[str, Any]) -> None:
        if self.attributes is None:
            self.attributes = {}
        self.attributes.update(attributes)

    def add_event(
        self, name: str, attributes: Mapping[str, Any] | None = None, timestamp: int | None = None
    ) -> None:
        if self.events is None:
            self.events = []
        self.events.append((name, timestamp or _time_ns(), dict(attributes) if attributes else None))

    def add_link(self, context: SpanContext, attributes: Mapping[str, Any] | None = None) -> None:
        if context is None or not context.is_valid:
            return
        if self.links is None:
            self.links = []
        self.links.append(
            (context.trace_id.to_bytes(16, "big"), context.span_id, dict(attributes or {}))
        )

    def update_name(self, name: str) -> None:
        self.name = name

    def set_status(self, status: Status | StatusCode, description: str | None = None) -> None:
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


def _open(name: str, tags: Tags, kind: int) -> tuple[Span, Any]:
    ctx = _get_context()
    parent = ctx.get(_SPAN_KEY)
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
    rec = _STATE.recorder or _auto_init()
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


# ---------------------------------------------------------------- public API


@functools.lru_cache(maxsize=4096)
def _tags(chip: str | None, link: str | None, op: str | None, precision: str | None) -> Tags:
    return Tags.build(chip=chip, link=link, op=op, precision=precision)


def _make_tags(
    chip: str | None,
    link: str | None,
    op: str | None,
    precision: str | None,
    attributes: Mapping[str, Any] | None,
) -> Tags:
    if attributes:
        return Tags.build(chip, link, op, precision, attributes)
    if chip is None and link is None and op is None and precision is None:
        return NO_TAGS
    return _tags(chip, link, op, precision)


def _kind(kind: otel_trace.SpanKind | int) -> int:
    return _KINDS.get(kind, kind) if isinstance(kind, otel_trace.SpanKind) else int(kind)


@overload
def trace(fn: Callable[P, R]) -> Callable[P, R]: ...


@overload
def trace(
    fn: None = None,
    *,
    name: str | None = None,
    chip: str | None = None,
    link: str | None = None,
    op: str | None = None,
    precision: str | None = None,
    attributes: Mapping[str, Any] | None = None,
    kind: otel_trace.SpanKind | int = otel_trace.SpanKind.INTERNAL,
) -> Callable[[Callable[P, R]], Callable[P, R]]: ...


def trace(
    fn: Callable[P, R] | None = None,
    *,
    name: str | None = None,
    chip: str | None = None,
    link: str | None = None,
    op: str | None = None,
    precision: str | None = None,
    attributes: Mapping[str, Any] | None = None,
    kind: otel_trace.SpanKind | int = otel_trace.SpanKind.INTERNAL,
) -> Any:
    """Trace every call of a function, async function, generator or method.

    Usable bare (`@trace`) or with arguments (`@trace(chip="gpu:0")`). Each call becomes
    a span named `name` (default: the function's qualified name), the child of whatever
    span, chiptrace or OpenTelemetry, is current. An exception marks the span ERROR,
    is recorded as an event, and propagates unchanged.

    Args:
        name: span name.
        chip: chip id the work ran on, e.g. "gpu:0" (fills chip.id and chip.type).
        link: link it moved over, e.g. "nvlink6:gpu:0-gpu:1" (fills link.*).
        op: op.kind (compute, comm, memcpy, io, idle, host).
        precision: op.precision (fp32, bf16, fp16, fp8, nvfp4, int8).
        attributes: static attributes added to every span.
        kind: OpenTelemetry span kind.

    Raises:
        ChipError: unknown chip, link, op kind or precision (at decoration, not per call).
    """
    tags = _make_tags(chip, link, op, precision, attributes)
    span_kind = _kind(kind)

    def decorate(f: Callable[P, R]) -> Callable[P, R]:
        if isinstance(f, (staticmethod, classmethod)):
            return type(f)(decorate(f.__func__))  # type: ignore[return-value]
        if not _STATE.enabled:
            return f  # CHIPTRACE_ENABLED=0 at import: zero cost, the function untouched
        span_name = name or _default_name(f)
        if inspect.isasyncgenfunction(f):
            raise ConfigError(
                f"@trace on async generator {span_name!r} is not supported; "
                "use `async with chiptrace.span(...)` inside it"
            )
        if inspect.isgeneratorfunction(f):
            return _wrap_generator(f, span_name, tags, span_kind)
        if inspect.iscoroutinefunction(f):
            return _wrap_coroutine(f, span_name, tags, span_kind)
        return _wrap_function(f, span_name, tags, span_kind)

    if fn is not None:
        return decorate(fn)
    return decorate


def _default_name(f: Callable[..., Any]) -> str:
    qualname = getattr(f, "__qualname__", None) or getattr(f, "__name__", None) or repr(f)
    return qualname.replace("<locals>.", "")


def _wrap_function(fn: Callable[P, R], name: str, tags: Tags, kind: int) -> Callable[P, R]:
    """The hottest path in chiptrace: `_open` and the fast half of `_close` are inlined
    here because two Python call frames cost ~0.15 us of a ~1.5 us budget."""
    state = _STATE
    get_context, set_context, reset_context = _get_context, _set_context, _reset_context
    span_key, time_ns, randbits, span_cls, ctx_cls = _SPAN_KEY, _time_ns, _randbits, Span, Context

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        if not state.enabled:
            return fn(*args, **kwargs)
        ctx = get_context()
        parent = ctx.get(span_key)
        if parent.__class__ is span_cls:
            span = span_cls(parent.trace_id, randbits(64) or 1, parent.span_id, name, kind, tags)
            token = set_context(ctx_cls({**ctx, span_key: span}))
            span.start_ns = time_ns()
        else:  # a root, or an OpenTelemetry parent: the general path
            span, token = _open(name, tags, kind)
        try:
            return fn(*args, **kwargs)
        except BaseException as e:
            span._fail(e)
            raise
        finally:
            span.end_ns = time_ns()
            try:
                reset_context(token)
            except ValueError:
                pass
            rec = state.recorder
            if rec is not None and len(rec.rows) < rec.max_buffered:
                rec.rows.append(span)
            else:
                span.end_ns, end = 0, span.end_ns
                _finish(span, end)  # first span, or a full buffer: the slow path counts it

    return wrapper


def _wrap_coroutine(fn: Callable[P, Any], name: str, tags: Tags, kind: int) -> Callable[P, Any]:
    state = _STATE

    @functools.wraps(fn)
    async def wrapper(*args: P.args, **kwargs: P.kwargs) -> Any:
        if not state.enabled:
            return await fn(*args, **kwargs)
        span, token = _open(name, tags, kind)
        try:
            return await fn(*args, **kwargs)
        except BaseException as e:
            span._fail(e)
            raise
        finally:
            _close(span, token)

    return wrapper


def _wrap_generator(fn: Callable[P, Any], name: str, tags: Tags, kind: int) -> Callable[P, Any]:
    """A generator's span runs from its first resume to its end; its context is attached
    only while it runs, so it never leaks into the caller between yields."""
    state = _STATE

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> Any:
        gen = fn(*args, **kwargs)
        if not state.enabled:
            return (yield from gen)
        span: Span | None = None
        to_send: Any = None
        to_throw: BaseException | None = None
        try:
            while True:
                if span is None:
                    span, token = _open(name, tags, kind)
                else:
                    token = _set_context(Context({**_get_context(), _SPAN_KEY: span}))
                try:
                    if to_throw is not None:
                        exc, to_throw = to_throw, None
                        item = gen.throw(exc)
                    else:
                        item = gen.send(to_send)
                finally:
                    try:
                        _reset_context(token)
                    except ValueError:
                        pass
                try:
                    to_send = yield item
                except GeneratorExit:
                    gen.close()
                    raise
                except BaseException as e:  # thrown in by the caller: pass it on
                    to_throw = e
        except StopIteration as stop:
            return stop.value
        except BaseException as e:
            if span is not None:
                span._fail(e)
            raise
        finally:
            if span is not None:
                _finish(span)

    return wrapper


class span:  # noqa: N801 - used like a function: `with chiptrace.span("load"):`
    """A span around a block: `with chiptrace.span("copy", link="pcie5:cpu:0-gpu:0") as s:`.

    The object `as` gives is a `Span`: set attributes, add events, set status. Works with
    `async with` too. Arguments as for `trace`.

    Raises:
        ChipError: unknown chip, link, op kind or precision.
    """

    __slots__ = ("_name", "_tags", "_kind", "_span", "_token", "_attributes")

    def __init__(
        self,
        name: str,
        *,
        chip: str | None = None,
        link: str | None = None,
        op: str | None = None,
        precision: str | None = None,
        attributes: Mapping[str, Any] | None = None,
        kind: otel_trace.SpanKind | int = otel_trace.SpanKind.INTERNAL,
    ) -> None:
        self._name = name
        self._tags = _make_tags(chip, link, op, precision, None)
        self._attributes = attributes
        self._kind = _kind(kind)
        self._span: Span | None = None
        self._token: Any = None

    def __enter__(self) -> Span:
        s, self._token = _open(self._name, self._tags, self._kind)
        if self._attributes:
            s.set_attributes(self._attributes)
        if not _STATE.enabled:
            s.end_ns = -1  # never recorded; still a valid context for children
        self._span = s
        return s

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        s = self._span
        if s is None:
            return
        if exc is not None:
            s._fail(exc)
        _close(s, self._token)

    async def __aenter__(self) -> Span:
        return self.__enter__()

    async def __aexit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        self.__exit__(exc_type, exc, tb)


def current_span() -> otel_trace.Span:
    """The current span, chiptrace's or another instrumentation's (INVALID_SPAN if none)."""
    return otel_trace.get_current_span()


def carry(fn: Callable[P, R]) -> Callable[P, R]:
    """Bind `fn` to the current context, so spans it opens in another thread nest here.

    `pool.submit(chiptrace.carry(work), x)`: a thread starts with an empty context, so
    without this a worker's spans would start new traces.
    """
    ctx = _get_context()

    @functools.wraps(fn)
    def bound(*args: P.args, **kwargs: P.kwargs) -> R:
        token = _set_context(ctx)
        try:
            return fn(*args, **kwargs)
        finally:
            _reset_context(token)

    return bound


# ---------------------------------------------------------------- lifecycle


def init(
    dir: str | os.PathLike[str] | None = None,  # noqa: A002 - the natural name for users
    *,
    service: str | None = None,
    enabled: bool | None = None,
    exporters: Iterable[Any] = (),
    sinks: Iterable[SpanSink] = (),
    resource: Mapping[str, Any] | None = None,
    manifest: Mapping[str, Any] | None = None,
    flush_interval_s: float | None = None,
    flush_spans: int | None = None,
    max_buffered: int | None = None,
    otlp_endpoint: str | None = None,
    run_id: str | None = None,
    sample_host: bool | None = None,
    sample_interval: float | None = None,
) -> Recorder | None:
    """Configure tracing for this process; replaces (and flushes) any earlier recorder.

    Keyword arguments win over CHIPTRACE_* / OTEL_* variables, which win over defaults.
    Without init(), the first traced call configures from the environment and writes
    under ./chiptrace-traces/<run-id>/.

    Args:
        dir: the trace directory.
        service: service.name of the spans' resource.
        enabled: False makes traced calls cost a flag check and record nothing.
        exporters: OpenTelemetry SpanExporters that also receive every span.
        sinks: chiptrace sinks (Arrow batches) that also receive every span.
        resource: extra resource attributes.
        manifest: extra facts for the run manifest.
        flush_interval_s, flush_spans, max_buffered: buffer policy.
        otlp_endpoint: stream spans to this OTLP endpoint too (see chiptrace.exporters).
        run_id: names the default directory.
        sample_host: also sample the real host (CPUs, memory, NICs, disks, NVIDIA GPUs)
            on a daemon thread into the same dir's `metrics` table (chiptrace.host).
        sample_interval: seconds between host samples (default 0.1).

    Returns:
        The recorder, or None when tracing is disabled.

    Raises:
        ConfigError: a bad setting; StoreError: the directory cannot be created.
    """
    sample_on, interval = _config.resolve_sampling(sample_host, sample_interval)
    cfg = _config.resolve(
        dir=dir,
        service=service,
        enabled=enabled,
        resource=resource,
        flush_interval_s=flush_interval_s,
        flush_spans=flush_spans,
        max_buffered=max_buffered,
        otlp_endpoint=otlp_endpoint,
        run_id=run_id,
    )
    with _STATE.lock:
        old, _STATE.recorder = _STATE.recorder, None
        if old is not None:
            old.shutdown()
        _stop_sampler()
        _STATE.enabled = cfg.enabled
        if not cfg.enabled:
            return None
        _STATE.recorder = _build_recorder(cfg, exporters, sinks, manifest)
        if sample_on:
            _STATE.sampler = _start_sampler(cfg, interval)
        return _STATE.recorder


def _build_recorder(
    cfg: _config.Config,
    exporters: Iterable[Any],
    sinks: Iterable[SpanSink],
    manifest: Mapping[str, Any] | None,
) -> Recorder:
    from chiptrace._otel import ExporterSink, otlp_sink

    writer = PartWriter(
        cfg.dir,
        manifest={"run_id": cfg.run_id, "service": cfg.service, "source": "code", **(manifest or {})},
    )
    all_sinks: list[SpanSink] = [StoreSink(writer), *sinks]
    all_sinks += [ExporterSink(e, cfg) for e in exporters]
    if cfg.otlp_endpoint:
        all_sinks.append(otlp_sink(cfg))
    rec = Recorder(cfg, all_sinks, writer)
    on_exit(rec.shutdown)
    # multiprocessing children leave through os._exit, skipping atexit; its finalizers run.
    multiprocessing.util.Finalize(rec, rec.shutdown, exitpriority=100)
    return rec


_auto_lock = threading.Lock()


def _after_fork_in_child() -> None:
    """A forked child must not flush its parent's buffer nor reuse its part names: drop
    the inherited recorder; the child's first span starts its own, same dir and run."""
    global _auto_lock
    _auto_lock = threading.Lock()
    _STATE.lock = threading.Lock()
    rec, _STATE.recorder = _STATE.recorder, None
    if rec is not None:
        rec.abandon()
        _STATE.fork_config = rec.config


os.register_at_fork(after_in_child=_after_fork_in_child)


def _auto_init() -> Recorder | None:
    """The first traced call without init(): configure from the environment, once."""
    if not _STATE.enabled:
        return None
    with _auto_lock:
        if _STATE.recorder is not None:
            return _STATE.recorder
        try:
            cfg = _STATE.fork_config
            if cfg is not None:
                return init(
                    cfg.dir,
                    service=cfg.service,
                    run_id=cfg.run_id,
                    resource=cfg.resource,
                    flush_interval_s=cfg.flush_interval_s,
                    flush_spans=cfg.flush_spans,
                    max_buffered=cfg.max_buffered,
                )
            return init()
        except Exception as e:  # noqa: BLE001 - tracing must not crash the traced program
            logging.getLogger("chiptrace").warning("chiptrace: tracing disabled: %s", e)
            _STATE.enabled = False
            return None


def _start_sampler(cfg: _config.Config, interval: float) -> Any:
    """The host sampler beside the recorder: same dir, run and host."""
    from chiptrace.host.sampler import HostSampler  # psutil and NVML load only when asked for

    sampler = HostSampler(
        cfg.dir, interval=interval, run_id=cfg.run_id, service=cfg.service, host=cfg.host
    ).start()
    on_exit(sampler.stop)
    # Child processes inherit the environment: they see a sampler already runs on this host.
    os.environ.setdefault(_config.ENV_SAMPLER_PID, str(os.getpid()))
    return sampler


def _stop_sampler() -> None:
    sampler, _STATE.sampler = _STATE.sampler, None
    if sampler is not None:
        sampler.stop()


def get_recorder() -> Recorder | None:
    """The process's recorder, if tracing has started."""
    return _STATE.recorder


def flush() -> int:
    """Write everything buffered now; returns the number of spans flushed."""
    rec = _STATE.recorder
    return rec.flush() if rec is not None else 0


def shutdown() -> None:
    """Flush and stop the recorder; a later traced call starts a new one."""
    with _STATE.lock:
        rec, _STATE.recorder = _STATE.recorder, None
    if rec is not None:
        rec.shutdown()
    _stop_sampler()
