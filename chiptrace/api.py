"""The instrumentation API: `@trace`, `span()`, `carry()`, `current_span()`.

Configuration (`init`, `flush`, `shutdown`) lives in chiptrace.lifecycle and is
re-exported here; the span object and its hot path live in chiptrace.recording.spans.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar, overload

from opentelemetry import trace as otel_trace
from opentelemetry.trace.propagation import _SPAN_KEY

from chiptrace.errors import ConfigError
from chiptrace.lifecycle import flush, get_recorder, init, shutdown
from chiptrace.recording import device as _device
from chiptrace.recording import sites as _sites
from chiptrace.recording import spans as _span_mod
from chiptrace.recording import wrappers as _wrap
from chiptrace.recording.spans import (
    _KINDS,
    _STATE,
    Span,
    _close,
    _finish,
    _get_context,
    _open,
    _parent_ids,
    _record,
    _reset_context,
    _row,
    _set_context,
    _time_ns,
    general_row,
)
from chiptrace.vocab import NO_TAGS, SPAN_KIND_INTERNAL, Tags

P = ParamSpec("P")
R = TypeVar("R")

__all__ = [
    "Span",
    "trace",
    "span",
    "carry",
    "current_span",
    "init",
    "flush",
    "shutdown",
    "get_recorder",
    "_STATE",
]


_RawTags = _sites.RawTags
_site_index = _sites._index  # site numbers by (name, id(tags), kind); read without a lock
_tags = _sites.tags  # interned by value: one Tags per distinct chip/link/op/precision


def _make_tags(
    chip: str | None,
    link: str | None,
    op: str | None,
    precision: str | None,
    attributes: Mapping[str, Any] | None,
) -> Tags:
    if attributes:
        return Tags.build(chip, link, op, precision, _span_mod.bounded(attributes))
    if chip is None and link is None and op is None and precision is None:
        return NO_TAGS
    return _tags(chip, link, op, precision)


_INTERNAL = otel_trace.SpanKind.INTERNAL
_new_span = object.__new__


def _kind(kind: otel_trace.SpanKind | int) -> int:
    return _KINDS[kind] if isinstance(kind, otel_trace.SpanKind) else int(kind)


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
    device_time: bool | None = None,
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
    device_time: bool | None = None,
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
        device_time: on a GPU-tagged function, also time the GPU's work (CUDA events
            around the call; see docs/torch.md). None: CHIPTRACE_DEVICE_TIME.

    Raises:
        ChipError: unknown chip, link, op kind or precision (at decoration, not per call).
        TypeError: the decorated object is a class or not callable.
    """
    tags = _make_tags(chip, link, op, precision, attributes)
    span_kind = _kind(kind)

    def decorate(f: Callable[P, R]) -> Callable[P, R]:
        if isinstance(f, (staticmethod, classmethod)):
            return type(f)(decorate(f.__func__))
        _check_decoratable(f)
        if not _STATE.enabled:
            return f  # CHIPTRACE_ENABLED=0 at import: zero cost, the function untouched
        span_name = name or _default_name(f)
        if inspect.isasyncgenfunction(f):
            raise ConfigError(
                f"@trace on async generator {span_name!r} is not supported; "
                "use `async with chiptrace.span(...)` inside it"
            )
        plain = not (inspect.isgeneratorfunction(f) or inspect.iscoroutinefunction(f))
        if (device_time or _device.DEFAULT) and _device.wanted(device_time, tags, span_name, plain):
            return _device.wrap_function(f, span_name, tags, span_kind)
        if inspect.isgeneratorfunction(f):
            return _wrap_generator(f, span_name, tags, span_kind)
        if inspect.iscoroutinefunction(f):
            return _wrap_coroutine(f, span_name, tags, span_kind)
        return _wrap_function(f, span_name, tags, span_kind)

    if fn is not None:
        return decorate(fn)
    return decorate


def _check_decoratable(f: Any) -> None:
    """A class would become a function (isinstance and subclassing break), and anything
    else not callable would fail at the first call: say so at decoration instead."""
    if isinstance(f, type):
        raise TypeError(
            f"@chiptrace.trace cannot decorate class {f.__name__}: "
            "decorate its methods (or __init__) instead"
        )
    if not callable(f):
        raise TypeError(
            f"@chiptrace.trace expects a function, got {type(f).__name__} {f!r:.60}; "
            "for a name use @chiptrace.trace(name=...)"
        )


def _default_name(f: Callable[..., Any]) -> str:
    qualname = getattr(f, "__qualname__", None) or getattr(f, "__name__", None) or repr(f)
    return qualname.replace("<locals>.", "")


def _wrap_function(fn: Callable[P, R], name: str, tags: Tags, kind: int) -> Callable[P, R]:
    """The hottest path in chiptrace: a wrapper compiled for this function (_wrap.py)."""
    site = _sites.site(name, tags, kind)
    if site < 0:  # a name that is not a string, or a full site table: the general path
        return _wrap_general(fn, name, tags, kind)
    return _wrap.wrap(fn, site)


def _wrap_general(fn: Callable[P, R], name: str, tags: Tags, kind: int) -> Callable[P, R]:
    state = _STATE

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        if not state.enabled:
            return fn(*args, **kwargs)
        span, token = _open(name, tags, kind)
        try:
            return fn(*args, **kwargs)
        except BaseException as e:
            span._fail(e)
            raise
        finally:
            _close(span, token)

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
                    token = _set_context({**_get_context(), _SPAN_KEY: span})
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


class _PyBlock:
    """`with chiptrace.span(...)`'s enter and exit in Python: the reference, and what runs
    where the C ones (chiptrace/recording/_cwrap.c, `Block`) were not built. `span` below
    takes the C ones as its base where they were."""

    __slots__ = ()
    _name: str
    _tags: Tags
    _kind: int
    _last: Span | None
    _attributes: Mapping[str, Any] | None

    def _fallback(self) -> Span | None:
        raise NotImplementedError

    def __enter__(self) -> Span:
        # _open, inlined: a Python call level costs ~0.05 us of the ~1 us budget.
        st = _STATE
        if st._recorder is None and st._enabled:
            st.auto_init()  # before the start time: the start-up is not the span's
        ctx = _get_context()
        parent = ctx.get(_SPAN_KEY)
        s = _new_span(Span)  # Span.__init__'s stores, without its call frame
        s.span_id = sid = _span_mod._new_id()
        if parent.__class__ is Span:
            s.trace_hi, s.trace_lo, s.parent_id = parent.trace_hi, parent.trace_lo, parent.span_id
        elif parent is None and st._remote_root is None:  # a root: no call, ~0.1 us saved
            s.trace_hi, s.trace_lo, s.parent_id = _span_mod._TRACE_HI, sid, 0
        else:
            s.trace_hi, s.trace_lo, s.parent_id = _parent_ids(parent, sid)
        s.name, s.kind, s.tags = self._name, self._kind, self._tags
        s.end_ns = 0 if st._enabled else -1  # -1: never recorded; still a valid parent
        if self._attributes:
            s.attributes = dict(self._attributes)
        if len(ctx) == (parent is not None):  # the context holds only the parent span
            s._token = _set_context({_SPAN_KEY: s})
        else:
            s._token = _set_context({**ctx, _SPAN_KEY: s})
        s._owner = self
        self._last = s  # type: ignore[misc]  # a slot of span, the subclass
        s.start_ns = _time_ns()
        return s

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        end = _time_ns()
        s = _get_context().get(_SPAN_KEY)  # _pop, inlined
        if s.__class__ is Span and s._owner is self:
            s._owner = None
        else:
            s = self._fallback()
            if s is None:
                return
        if exc is not None:
            s._fail(exc)
        try:
            _reset_context(s._token)
        except (ValueError, RuntimeError):
            pass  # the token belongs to another context (a task or thread took over)
        if s.end_ns:
            return  # ended already (end() in the block), or tracing is off
        s.end_ns = end
        # _row, inlined (~0.1 us): a site row, with the attributes when there are any.
        name = s.name
        if s.events is None and s.links is None and not s.status_code and name.__class__ is str:
            site = _site_index.get((name, id(s.tags), s.kind))
            if site is None:  # a new site, or unchecked tags past a full table (no site)
                site = -1 if isinstance(s.tags, _RawTags) else _sites.site(name, s.tags, s.kind)
            attrs = s.attributes
            if site < 0:  # no site number: a full table (or RawTags past the tag table)
                row = general_row(s)
            elif attrs is None:
                row = (site, s.trace_hi, s.trace_lo, s.span_id, s.parent_id, s.start_ns, end)
            else:
                # The attributes flat in the row, the keys then the values: a row that holds a
                # dict (or nested tuples) stays tracked by the garbage collector while it
                # waits, and a million buffered cost ~0.6 s a full collection, a dozen of them
                # per million spans; a flat row of atomic values is untracked at the first.
                row = (
                    site,
                    s.trace_hi,
                    s.trace_lo,
                    s.span_id,
                    s.parent_id,
                    s.start_ns,
                    end,
                    *attrs,
                    *attrs.values(),
                )
        else:
            row = _row(s)
        rec = _STATE._recorder
        if rec is None:
            _record(row)
        else:  # Recorder.record, inlined
            cur = rec.cur
            cur.append(row)
            if len(cur) >= rec.chunk_rows:
                rec.roll()


if TYPE_CHECKING:  # mypy takes no base class from a variable
    _Block = _PyBlock
else:
    _Block = _wrap.block_base(_PyBlock)


class span(_Block):  # noqa: N801 - used like a function: `with chiptrace.span("load"):`
    """A span around a block: `with chiptrace.span("copy", link="pcie5:cpu:0-gpu:0") as s:`.

    The object `as` gives is a `Span`: set attributes, add events, set status. Works with
    `async with` too. Arguments as for `trace` (`device_time=True`: a GPU-tagged block
    also times the GPU's work).

    Raises:
        ChipError: unknown chip, link, op kind or precision.
    """

    # Each entry's context token lives on the Span it opens (`_token`, with `_owner` this
    # object), and an exit ends the current span when it is one of this object's: so one
    # object can be entered again while open (nested, by threads, by asyncio tasks) and
    # each exit ends its own entry. `_last` is the fallback for a block that left another
    # context current (a library that attached and never detached).
    __slots__ = ("_name", "_tags", "_kind", "_last", "_attributes")

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
        device_time: bool | None = None,
    ) -> None:
        self._name = name
        tagged = chip is not None or link is not None or op is not None or precision is not None
        self._tags = _tags(chip, link, op, precision) if tagged else NO_TAGS
        if attributes and len(attributes) > _span_mod.UNCHECKED_ATTRIBUTES:
            attributes = _span_mod.bounded(attributes)  # under the OTEL_* span limits
        self._attributes = attributes
        self._kind = SPAN_KIND_INTERNAL if kind is _INTERNAL else _kind(kind)
        self._last: Span | None = None
        if (device_time or _device.DEFAULT) and _device.wanted(device_time, self._tags, name):
            self.__class__ = _device.span_class(span)  # GPU-timed enter and exit (_device.py)

    def _pop(self) -> Span | None:
        """The span of the entry now exiting: the current span when it is one of ours (the
        usual case, whatever thread or task), else the latest entry if still open; None
        when there is none (an exit without its enter)."""
        cur = _get_context().get(_SPAN_KEY)
        if cur.__class__ is Span and cur._owner is self:
            cur._owner = None
            return cur
        return self._fallback()

    def _fallback(self) -> Span | None:
        last = self._last
        if last is not None and last._owner is self:
            last._owner = None
            return last
        return None

    async def __aenter__(self) -> Span:
        return self.__enter__()

    async def __aexit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        self.__exit__(exc_type, exc, tb)


_wrap.bind_span(span, Span, _sites, general_row, _row)


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
