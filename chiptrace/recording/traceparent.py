"""The W3C `traceparent` a parent process leaves in the environment, read at import.

Apart from chiptrace.propagation because the span machinery (_span) needs it when it loads,
while propagation's process helpers (`subprocess_env`, `in_context`) need the recorder
(chiptrace.api): one module for both would be an import cycle.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from opentelemetry import trace as otel_trace
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

ENV_TRACEPARENT = "TRACEPARENT"
ENV_TRACESTATE = "TRACESTATE"
W3C = TraceContextTextMapPropagator()


def remote_parent_from_env(env: Mapping[str, str] | None = None) -> tuple[bytes, int] | None:
    """(trace id, span id) from TRACEPARENT, or None when absent or malformed."""
    env = os.environ if env is None else env
    raw = env.get(ENV_TRACEPARENT)
    if not raw:
        return None
    carrier = {"traceparent": raw}
    if env.get(ENV_TRACESTATE):
        carrier["tracestate"] = env[ENV_TRACESTATE]
    sc = otel_trace.get_current_span(W3C.extract(carrier)).get_span_context()
    if not sc.is_valid:
        return None
    return sc.trace_id.to_bytes(16, "big"), sc.span_id
