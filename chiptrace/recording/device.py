"""GPU-true timing for GPU-tagged spans: `@trace(chip="gpu:0", device_time=True)`.

A GPU-tagged span times the Python call: on a GPU that is the launch of the work, which
runs later, asynchronously. With `device_time=True` (or CHIPTRACE_DEVICE_TIME=1 for every
GPU-tagged span) a device timer also marks the current stream before and after the call;
the span is held back until the device has passed both marks, then recorded with
`device.start_ns`, `device.end_ns`, `device.duration_ns` and a child span `NAME (device)`
on the same chip covering the device's time. The marks are resolved on the recorder's
writer thread (Recorder.resolvers), never by synchronizing the program.

This module is the extension point; the CUDA timer is chiptrace.torch._device_time, looked
up by name on the first device-timed call (so `import chiptrace` never imports torch).
Spans without device_time never reach this module: the decorator picks its wrapper once,
and span() swaps its class once, at construction.
"""

from __future__ import annotations

import functools
import importlib
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias, TypeVar

from chiptrace import config as _config
from chiptrace.errors import ConfigError
from chiptrace.recording.spans import (
    _STATE,
    Span,
    _close,
    _open,
    _reset_context,
    _row,
    _time_ns,
    new_span_id,
)
from chiptrace.vocab import Tags

if TYPE_CHECKING:
    from chiptrace.api import span as ApiSpan
    from chiptrace.recorder import Recorder

R = TypeVar("R")
log = logging.getLogger("chiptrace")
PROVIDER = "chiptrace.torch._device_time"  # module with provider() -> DeviceTimer | None

try:
    DEFAULT = _config.device_time_default()
except ConfigError as e:  # one line, and tracing goes on without it
    log.warning("chiptrace: %s; device time is off", e)
    DEFAULT = False


class DeviceTimer(Protocol):
    """Marks a device's stream around a call; resolves the marks off the program's thread."""

    def start(self) -> Any:
        """Mark the start on the current stream; a token, or None when it cannot now."""

    def stop(self, token: Any) -> Any:
        """Mark the end; the token `hold` takes."""

    def hold(self, span: Span, token: Any) -> None:
        """Keep the ended span until its marks resolve, then `release` it into the
        recorder `attach` gives."""

    def resolve(self, final: bool) -> None:
        """Release the spans whose marks the device has passed (all of them if final)."""


_UNSET: Any = object()
_timer: Any = _UNSET
_warned: set[str] = set()


def _warn_once(key: str, message: str, *args: Any) -> None:
    if key not in _warned:
        _warned.add(key)
        log.warning(message, *args)


def timer() -> DeviceTimer | None:
    """The device timer, found on first use; None (one warning) where there is none."""
    global _timer
    if _timer is _UNSET:
        why = "PyTorch is not installed (pip install 'chiptrace[torch]')"
        try:
            found = importlib.import_module(PROVIDER).provider()
        except ImportError:
            found = None
        else:
            why = "CUDA is not available here"
        if found is None:
            _warn_once(
                "timer",
                "chiptrace: device_time=True: %s; GPU-tagged spans time the host call only",
                why,
            )
        _timer = found
    return _timer


def wanted(device_time: bool | None, tags: Tags, name: str, plain: bool = True) -> bool:
    """Whether a span gets device time: asked for (or CHIPTRACE_DEVICE_TIME) and GPU-tagged.

    Asking for it on a span that is not GPU-tagged, or on a generator or async function,
    warns once and is ignored.
    """
    on = DEFAULT if device_time is None else device_time
    if not on:
        return False
    if tags.chip_type != "gpu":
        if device_time:  # the global setting covers GPU-tagged spans only, silently
            _warn_once(
                "not-gpu",
                "chiptrace: device_time=True on span %r, which is not GPU-tagged (chip=%r): "
                "ignored; it times a GPU's work (further such spans are ignored silently)",
                name,
                tags.chip_id,
            )
        return False
    if not plain:
        _warn_once(
            "not-plain",
            "chiptrace: device_time=True on %r ignored: it applies to functions and "
            "`with chiptrace.span(...)`, not generators or async functions",
            name,
        )
        return False
    return True


def attach(resolve: Callable[[bool], None]) -> Recorder | None:
    """Have the current recorder's writer thread call `resolve` (once per recorder);
    returns that recorder, the one to `release` into."""
    rec = _STATE.recorder or _STATE.auto_init()
    if rec is not None and resolve not in rec.resolvers:
        rec.resolvers = [*rec.resolvers, resolve]
    return rec


def release(
    span: Span, rec: Recorder | None, device: tuple[int, int] | None = None, **attributes: Any
) -> None:
    """Record a held span into `rec` (the recorder `attach` gave: at shutdown it is no
    longer the current one); with (start, end) Unix ns of the device's time, as attributes
    and as a child span `NAME (device)` on the span's chip."""
    if rec is None:
        return
    if device is not None:
        start, end = device
        attrs = dict(span.attributes or {})
        attrs.update(
            {"device.start_ns": start, "device.end_ns": end, "device.duration_ns": end - start}
        )
        attrs.update(attributes)
        span.attributes = attrs  # still held, not yet the writer's: no ended-span rule
        child = Span(
            span.trace_hi,
            span.trace_lo,
            new_span_id(),
            span.span_id,
            f"{span.name} (device)",
            span.kind,
            span.tags,
        )
        child.start_ns, child.end_ns = start, end
        child.attributes = dict(attributes) if attributes else None
        rec.record(_row(span))
        rec.record(_row(child))
    else:
        rec.record(_row(span))


def _end(span: Span, token: Any, t: DeviceTimer | None, mark: Any) -> None:
    if mark is None or t is None:
        _close(span, token)
        return
    mark = t.stop(mark)
    span.end_ns = _time_ns()
    try:
        _reset_context(token)
    except ValueError:
        pass
    t.hold(span, mark)


def wrap_function(fn: Callable[..., R], name: str, tags: Tags, kind: int) -> Callable[..., R]:
    """`@trace(..., device_time=True)` on a plain function."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> R:
        if not _STATE.enabled:
            return fn(*args, **kwargs)
        t = timer()
        span, token = _open(name, tags, kind)
        mark = t.start() if t is not None else None  # None: no device, a plain span
        try:
            return fn(*args, **kwargs)
        except BaseException as e:
            span._fail(e)
            raise
        finally:
            _end(span, token, t, mark)

    return wrapper


@functools.lru_cache(maxsize=1)
def span_class(base: type[ApiSpan]) -> type[ApiSpan]:
    """The class a `chiptrace.span(...)` takes when device time applies: a subclass of
    `base`, chiptrace.api.span (passed in: api imports this module), made on first use. No
    slots of its own, so the span can take it in place: its context token holds the device
    mark beside it."""

    if TYPE_CHECKING:  # what `base` is; mypy takes no class from a variable
        Base: TypeAlias = ApiSpan
    else:
        Base = base

    class DeviceSpan(Base):
        __slots__ = ()

        def __enter__(self) -> Span:
            s = super().__enter__()
            t = timer()
            # The entry's token, with the device mark beside it, on its own span.
            s._token = (s._token, t.start() if t is not None and s.end_ns == 0 else None)
            return s

        def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
            s = self._pop()
            if s is None:
                return
            token, mark = s._token
            if mark is None:  # not timed: as any span
                s._token, s._owner = token, self
                return super().__exit__(exc_type, exc, tb)
            if exc is not None:
                s._fail(exc)
            _end(s, token, timer(), mark)

    return DeviceSpan
