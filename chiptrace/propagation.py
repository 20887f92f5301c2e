"""W3C trace context across process and host boundaries.

One trace must cover a job's threads, tasks, subprocesses, process pools and HTTP calls.
Within a process OpenTelemetry's context does it (and `chiptrace.carry` for threads);
across processes the W3C `traceparent` header does, through OpenTelemetry's propagators:

- HTTP: `inject(headers)` on the client, `with attach(request.headers):` on the server.
- subprocesses: `subprocess.run(cmd, env=subprocess_env())`; the child's root spans join
  the caller's trace (TRACEPARENT in the environment) and its parts land in the same dir.
- multiprocessing / process pools: `pool.submit(in_context(fn), ...)`: a picklable
  wrapper that carries the context and the trace dir to the worker.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Generic, ParamSpec, TypeVar

from opentelemetry import context as otel_context
from opentelemetry.propagate import get_global_textmap

from chiptrace import api
from chiptrace import config as _config
from chiptrace.recording.traceparent import ENV_TRACEPARENT, ENV_TRACESTATE, remote_parent_from_env
from chiptrace.recording.traceparent import W3C as _W3C

P = ParamSpec("P")
R = TypeVar("R")

_DIR_KEY = "chiptrace-dir"


def inject(carrier: dict[str, str] | None = None) -> dict[str, str]:
    """Write the current trace context into `carrier` (HTTP headers); returns it."""
    carrier = {} if carrier is None else carrier
    get_global_textmap().inject(carrier)
    return carrier


def extract(carrier: Mapping[str, str]) -> otel_context.Context:
    """The context a `traceparent` carrier describes (headers are matched case-insensitively)."""
    lowered = {k.lower(): v for k, v in carrier.items()}
    return get_global_textmap().extract(lowered)


@contextlib.contextmanager
def attach(carrier: Mapping[str, str]) -> Iterator[None]:
    """Make spans opened inside the block children of the remote span in `carrier`."""
    token = otel_context.attach(extract(carrier))
    try:
        yield
    finally:
        otel_context.detach(token)


def _trace_dir() -> str | None:
    rec = api.get_recorder()
    return str(rec.config.dir.resolve()) if rec is not None else os.environ.get(_config.ENV_DIR)


def subprocess_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """A copy of `env` (default os.environ) carrying the current trace context and trace dir,
    so a child process's spans join this trace and land in the same directory."""
    out = dict(os.environ if env is None else env)
    carrier = inject({})
    _W3C.inject(carrier)
    if "traceparent" in carrier:
        out[ENV_TRACEPARENT] = carrier["traceparent"]
    if carrier.get("tracestate"):
        out[ENV_TRACESTATE] = carrier["tracestate"]
    trace_dir = _trace_dir()
    if trace_dir:
        out.setdefault(_config.ENV_DIR, trace_dir)
    return out


class in_context(Generic[P, R]):  # noqa: N801 - used like a function
    """A picklable callable that runs `fn` in the caller's trace context, in any process.

    `ProcessPoolExecutor().submit(chiptrace.in_context(work), x)`: the worker's spans are
    children of the span that was current at submit time, and are written into the
    caller's trace dir. The worker's buffered spans are flushed when the task ends.
    """

    def __init__(self, fn: Callable[P, R]) -> None:
        self.fn = fn
        self.carrier = inject({})
        trace_dir = _trace_dir()
        if trace_dir:
            self.carrier[_DIR_KEY] = trace_dir
        self.pid = os.getpid()

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        other_process = os.getpid() != self.pid
        if other_process and api.get_recorder() is None and _DIR_KEY in self.carrier:
            api.init(self.carrier[_DIR_KEY])
        try:
            with attach(self.carrier):
                return self.fn(*args, **kwargs)
        finally:
            if other_process:
                api.flush()  # pool workers may be killed without running exit hooks

    def __repr__(self) -> str:
        return f"in_context({self.fn!r})"


def carrier_env(carrier: Mapping[str, Any]) -> dict[str, str]:
    """TRACEPARENT/TRACESTATE environment entries for a carrier (for custom launchers)."""
    out = {}
    if "traceparent" in carrier:
        out[ENV_TRACEPARENT] = str(carrier["traceparent"])
    if "tracestate" in carrier:
        out[ENV_TRACESTATE] = str(carrier["tracestate"])
    return out


__all__ = [
    "ENV_TRACEPARENT",
    "ENV_TRACESTATE",
    "attach",
    "carrier_env",
    "extract",
    "in_context",
    "inject",
    "remote_parent_from_env",
    "subprocess_env",
]
