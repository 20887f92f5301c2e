"""The span of a decorated call while it runs (chiptrace.recording.wrappers): a `Live` tuple of its ids.

A tuple, because making one is the least a Python object costs; it is what the context
holds, so that children, `current_span()` and OpenTelemetry find the call's span. Writes
to it (rare: `current_span().set_attribute(...)`, an exception) go to a Span kept aside
in _EXTRA under its span id, merged into the general row when the call ends.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from opentelemetry import trace as otel_trace
from opentelemetry.trace import SpanContext, Status, StatusCode
from opentelemetry.trace.propagation import _SPAN_KEY

from chiptrace.recording import sites as _sites
from chiptrace.recording.spans import (
    _SAMPLED,
    Span,
    _finish,
    _get_context,
    _parent_ids,
    _record,
    _reset_context,
    _set_context,
    _start,
    _time_ns,
)
from chiptrace.vocab import NO_TAGS

# Spans of decorated calls that were written to (current_span().set_attribute(...), an
# exception): span id -> a Span holding what was written, until the call ends.
_EXTRA: dict[int, Span] = {}


# A write to a decorated call's span after the call returned finds no call to merge it:
# its entry would stay. Past this many entries (far more than calls in flight) the table
# is cleared, so such writes cannot grow memory without end.
_MAX_EXTRA = 1 << 16


def _shadow(live: Live) -> Span:
    found = _EXTRA.get(live[2])
    if found is None:
        if len(_EXTRA) >= _MAX_EXTRA:
            _EXTRA.clear()
        found = Span(live[0], live[1], live[2], 0, None, 0, NO_TAGS)  # type: ignore[arg-type]
        _EXTRA[live[2]] = found
    return found


class Live(tuple, otel_trace.Span):
    """The span of a decorated call while it runs: (trace high, trace low, span id, start).

    A tuple, so making one costs the least Python allows; writes to it (rare: through
    `current_span()`) go to a Span kept aside in _EXTRA, merged into the row at the end.
    """

    __slots__ = ()

    @property
    def start_ns(self) -> int:
        return self[3]

    def get_span_context(self) -> SpanContext:
        return SpanContext((self[0] << 64) | self[1], self[2], False, _SAMPLED)

    def is_recording(self) -> bool:
        return True

    def set_attribute(self, key: str, value: Any) -> None:
        _shadow(self).set_attribute(key, value)

    def set_attributes(self, attributes: Mapping[str, Any]) -> None:
        _shadow(self).set_attributes(attributes)

    def add_event(
        self, name: str, attributes: Mapping[str, Any] | None = None, timestamp: int | None = None
    ) -> None:
        _shadow(self).add_event(name, attributes, timestamp)

    def add_link(self, context: SpanContext, attributes: Mapping[str, Any] | None = None) -> None:
        _shadow(self).add_link(context, attributes)

    def update_name(self, name: str) -> None:
        _shadow(self).update_name(name)

    def set_status(self, status: Status | StatusCode, description: str | None = None) -> None:
        _shadow(self).set_status(status, description)

    def record_exception(
        self,
        exception: BaseException,
        attributes: Mapping[str, Any] | None = None,
        timestamp: int | None = None,
        escaped: bool = False,
    ) -> None:
        _shadow(self).record_exception(exception, attributes, timestamp, escaped)

    def end(self, end_time: int | None = None) -> None:
        pass  # the decorator ends it when the call returns


def _fail_live(th: int, tl: int, sid: int, exc: BaseException) -> None:
    _shadow(Live((th, tl, sid, 0)))._fail(exc)


def _end_live(th: int, tl: int, sid: int, site: int, pid: int, start: int, end: int) -> None:
    """The end of a decorated call whose span was written to: a general row."""
    span = _EXTRA.pop(sid, None)
    if span is None:  # cleared meanwhile (see _MAX_EXTRA): what was written is lost
        _record((site, th, tl, sid, pid, start, end))
        return
    span.parent_id = pid
    span.start_ns = start
    if span.name is None:
        span.name = _sites.NAMES[site]
    span.kind = _sites.KINDS[site]
    span.tags = _sites.TAGS[site]
    _finish(span, end)


def bindings() -> dict[str, Any]:
    """What the wrappers compiled by chiptrace.recording.wrappers call: chiptrace.recording
    binds them once, when it loads, before anything can be decorated. Here rather than
    in _span, which Live builds on."""
    return dict(
        Live=Live,
        parent_ids=_parent_ids,
        EXTRA=_EXTRA,
        end_live=_end_live,
        fail_live=_fail_live,
        record_first=_record,
        start=_start,
        get=_get_context,
        set=_set_context,
        reset=_reset_context,
        now=_time_ns,
        KEY=_SPAN_KEY,
    )
