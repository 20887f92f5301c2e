"""Settings: keyword arguments, then CHIPTRACE_* / OTEL_* variables, then defaults.

Every setting name lives here, and every value is validated once, here, with a message
that names the setting and the bad value.
"""

from __future__ import annotations

import os
import socket
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chiptrace.errors import ConfigError

ENV_ENABLED = "CHIPTRACE_ENABLED"
ENV_DIR = "CHIPTRACE_DIR"
ENV_SERVICE = "CHIPTRACE_SERVICE"
ENV_RUN_ID = "CHIPTRACE_RUN_ID"
ENV_FLUSH_INTERVAL = "CHIPTRACE_FLUSH_INTERVAL"
ENV_FLUSH_SPANS = "CHIPTRACE_FLUSH_SPANS"
ENV_MAX_BUFFERED = "CHIPTRACE_MAX_BUFFERED"
ENV_MAX_BUFFERED_BYTES = "CHIPTRACE_MAX_BUFFERED_BYTES"
# How long exit (atexit, shutdown()) waits for the last flush and the sinks' close; what is
# not written by then is counted as dropped in the manifest (a SIGTERM: chiptrace.recording.exit_hooks).
ENV_SHUTDOWN_TIMEOUT = "CHIPTRACE_SHUTDOWN_TIMEOUT"
# Sinks other than the store (OpenTelemetry SpanExporters, OTLP) each run on a queue and
# thread of their own: spans queued at most, and how long one export may take (the SDK's
# BatchSpanProcessor variable, in milliseconds) before the sink counts as hung.
ENV_SINK_QUEUE_SPANS = "CHIPTRACE_SINK_QUEUE_SPANS"
ENV_EXPORT_TIMEOUT = "OTEL_BSP_EXPORT_TIMEOUT"
# OpenTelemetry span limits (the SDK's names and defaults; value length: no limit unless set).
ENV_ATTRIBUTE_COUNT_LIMIT = "OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT"
ENV_ATTRIBUTE_VALUE_LENGTH_LIMIT = "OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT"
ENV_EVENT_COUNT_LIMIT = "OTEL_SPAN_EVENT_COUNT_LIMIT"
ENV_LINK_COUNT_LIMIT = "OTEL_SPAN_LINK_COUNT_LIMIT"
ENV_OTEL_SERVICE = "OTEL_SERVICE_NAME"
ENV_OTEL_RESOURCE = "OTEL_RESOURCE_ATTRIBUTES"
ENV_OTLP_ENDPOINT = "OTEL_EXPORTER_OTLP_ENDPOINT"
ENV_OTLP_TRACES_ENDPOINT = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
ENV_SAMPLE_HOST = "CHIPTRACE_SAMPLE_HOST"
ENV_SAMPLE_INTERVAL = "CHIPTRACE_SAMPLE_INTERVAL"
ENV_SAMPLER_PID = "CHIPTRACE_SAMPLER_PID"  # set by the process that samples the host
ENV_DEVICE_TIME = "CHIPTRACE_DEVICE_TIME"  # GPU-tagged spans time the device (chiptrace.torch)
ENV_DASK_SCHEDULER = "CHIPTRACE_DASK_SCHEDULER"  # import/report --dask default address
# Set by torchrun (and torch.distributed.launch, DeepSpeed, Accelerate) in each rank.
ENV_RANK = "RANK"
ENV_LOCAL_RANK = "LOCAL_RANK"
ENV_WORLD_SIZE = "WORLD_SIZE"

DEFAULT_ROOT = "chiptrace-traces"
DEFAULT_FLUSH_INTERVAL_S = 2.0
DEFAULT_FLUSH_SPANS = 200_000
DEFAULT_MAX_BUFFERED = 1_000_000
DEFAULT_MAX_BUFFERED_BYTES = 512 << 20
# The SDK's export timeout: a healthy store writes a full 1M-span buffer well within it
# even on a loaded machine (~15 s on 2 busy cores); a hung one costs exit no more.
DEFAULT_SHUTDOWN_TIMEOUT_S = 30.0
DEFAULT_SINK_QUEUE_SPANS = 200_000
DEFAULT_EXPORT_TIMEOUT_MS = 30_000
DEFAULT_COUNT_LIMIT = 128
DEFAULT_SAMPLE_INTERVAL_S = 0.1  # host sampler: 10 Hz
MIN_SAMPLE_INTERVAL_S = 0.01

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def new_run_id() -> str:
    """A sortable run id: UTC time, then the pid to keep two runs in one second apart."""
    return time.strftime("%Y%m%d-%H%M%S", time.gmtime()) + f"-{os.getpid()}"


def _default_service() -> str:
    argv0 = Path(sys.argv[0]).stem if sys.argv and sys.argv[0] else ""
    return argv0 if argv0 and argv0 not in ("-c", "-m") else "chiptrace"


@dataclass(frozen=True)
class Config:
    """The resolved settings of one process's recorder."""

    enabled: bool = True
    dir: Path = Path(DEFAULT_ROOT)
    run_id: str = ""
    service: str = "chiptrace"
    resource: Mapping[str, Any] = field(default_factory=dict)
    flush_interval_s: float = DEFAULT_FLUSH_INTERVAL_S
    flush_spans: int = DEFAULT_FLUSH_SPANS
    max_buffered: int = DEFAULT_MAX_BUFFERED
    otlp_endpoint: str | None = None
    host: str = field(default_factory=socket.gethostname)
    max_buffered_bytes: int = DEFAULT_MAX_BUFFERED_BYTES
    shutdown_timeout_s: float = DEFAULT_SHUTDOWN_TIMEOUT_S
    sink_queue_spans: int = DEFAULT_SINK_QUEUE_SPANS
    export_timeout_s: float = DEFAULT_EXPORT_TIMEOUT_MS / 1000
    limits: SpanLimits = field(default_factory=lambda: SpanLimits())


@dataclass(frozen=True)
class SpanLimits:
    """OpenTelemetry span limits: what a span keeps of its attributes, events and links
    (the rest is dropped, as the SDK does). `value_length` None: strings kept whole."""

    attributes: int = DEFAULT_COUNT_LIMIT
    value_length: int | None = None
    events: int = DEFAULT_COUNT_LIMIT
    links: int = DEFAULT_COUNT_LIMIT


def span_limits(env: Mapping[str, str] | None = None) -> SpanLimits:
    """The OTEL_SPAN_*_COUNT_LIMIT / OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT variables.

    Raises:
        ConfigError: a value that is not a whole number >= 0.
    """
    env = os.environ if env is None else env

    def read(name: str, default: int | None) -> int | None:
        raw = env.get(name, "").strip()
        return default if raw == "" else int(_parse_number(name, raw, int, 0))

    return SpanLimits(
        attributes=read(ENV_ATTRIBUTE_COUNT_LIMIT, DEFAULT_COUNT_LIMIT) or 0,
        value_length=read(ENV_ATTRIBUTE_VALUE_LENGTH_LIMIT, None),
        events=read(ENV_EVENT_COUNT_LIMIT, DEFAULT_COUNT_LIMIT) or 0,
        links=read(ENV_LINK_COUNT_LIMIT, DEFAULT_COUNT_LIMIT) or 0,
    )


def parse_bool(name: str, raw: str | bool) -> bool:
    if isinstance(raw, bool):
        return raw
    low = raw.strip().lower()
    if low in _TRUE:
        return True
    if low in _FALSE:
        return False
    raise ConfigError(f"{name}={raw!r}: expected one of 1/0, true/false, yes/no, on/off")


def _parse_number(name: str, raw: Any, kind: type, minimum: float) -> Any:
    try:
        value = kind(raw)
    except (TypeError, ValueError):
        what = "a whole number" if kind is int else "a number"
        raise ConfigError(f"{name}={raw!r}: expected {what}") from None
    if value < minimum:
        raise ConfigError(f"{name}={raw!r}: expected a value >= {minimum}")
    return value


def parse_resource_attributes(raw: str) -> dict[str, str]:
    """OTEL_RESOURCE_ATTRIBUTES: `key=value,key2=value2`, per the OTel specification."""
    attrs: dict[str, str] = {}
    for item in filter(None, (p.strip() for p in raw.split(","))):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"{ENV_OTEL_RESOURCE}: {item!r} is not key=value")
        attrs[key.strip()] = value.strip()
    return attrs


def _env_int(env: Mapping[str, str], name: str) -> int | None:
    """A launcher's integer variable; None when unset or not a whole number (the names are
    generic: a value that is not torchrun's is not chiptrace's to refuse)."""
    raw = env.get(name, "").strip()
    return int(raw) if raw.isascii() and raw.isdigit() else None


def local_rank(env: Mapping[str, str] | None = None) -> int:
    """This process's rank on its host: LOCAL_RANK (torchrun sets it), else 0."""
    found = _env_int(os.environ if env is None else env, ENV_LOCAL_RANK)
    return found if found is not None else 0


def rank_resource(env: Mapping[str, str], host: str) -> dict[str, Any]:
    """Resource attributes of a rank of a distributed job (RANK / LOCAL_RANK / WORLD_SIZE
    set, as torchrun sets them): rank, local rank, world size and host; {} otherwise.
    The names are the ones imported PyTorch profiler traces carry (`distributed.rank`).
    """
    found = {
        "distributed.rank": _env_int(env, ENV_RANK),
        "distributed.local_rank": _env_int(env, ENV_LOCAL_RANK),
        "distributed.world_size": _env_int(env, ENV_WORLD_SIZE),
    }
    if all(v is None for v in found.values()):
        return {}
    return {**{k: v for k, v in found.items() if v is not None}, "host.name": host}


def device_time_default(env: Mapping[str, str] | None = None) -> bool:
    """CHIPTRACE_DEVICE_TIME: GPU-tagged spans time the device unless they say otherwise.

    Raises:
        ConfigError: not a boolean.
    """
    env = os.environ if env is None else env
    return parse_bool(ENV_DEVICE_TIME, env.get(ENV_DEVICE_TIME, "") or "0")


def resolve(env: Mapping[str, str] | None = None, **kwargs: Any) -> Config:
    """Resolve settings from keyword arguments (None means unset), the environment, defaults.

    Raises:
        ConfigError: a setting has a value of the wrong kind or range.
    """
    env = os.environ if env is None else env

    def pick(key: str, var: str | None, default: Any) -> tuple[str, Any]:
        if kwargs.get(key) is not None:
            return key, kwargs[key]
        if var and env.get(var, "") != "":
            return var, env[var]
        return key, default

    unknown = set(kwargs) - set(Config.__dataclass_fields__) - {"dir"}
    if unknown:
        raise ConfigError(f"unknown setting(s): {', '.join(sorted(unknown))}")

    name, raw = pick("enabled", ENV_ENABLED, True)
    enabled = parse_bool(name, raw)
    host = kwargs.get("host") or socket.gethostname()
    resource = rank_resource(env, host)
    resource.update(parse_resource_attributes(env.get(ENV_OTEL_RESOURCE, "")))
    resource.update(kwargs.get("resource") or {})
    _, service = pick("service", ENV_SERVICE, None)
    service = (
        service or env.get(ENV_OTEL_SERVICE) or resource.get("service.name") or _default_service()
    )
    _, run_id = pick("run_id", ENV_RUN_ID, "")
    run_id = run_id or new_run_id()
    name, raw_dir = pick("dir", ENV_DIR, None)
    trace_dir = Path(raw_dir) if raw_dir else Path(DEFAULT_ROOT) / run_id
    name, raw = pick("flush_interval_s", ENV_FLUSH_INTERVAL, DEFAULT_FLUSH_INTERVAL_S)
    interval = _parse_number(name, raw, float, 0.01)
    name, raw = pick("flush_spans", ENV_FLUSH_SPANS, DEFAULT_FLUSH_SPANS)
    flush_spans = _parse_number(name, raw, int, 1)
    name, raw = pick("max_buffered", ENV_MAX_BUFFERED, DEFAULT_MAX_BUFFERED)
    max_buffered = _parse_number(name, raw, int, 1)
    name, raw = pick("max_buffered_bytes", ENV_MAX_BUFFERED_BYTES, DEFAULT_MAX_BUFFERED_BYTES)
    max_bytes = _parse_number(name, raw, int, 1)
    name, raw = pick("shutdown_timeout_s", ENV_SHUTDOWN_TIMEOUT, DEFAULT_SHUTDOWN_TIMEOUT_S)
    shutdown_timeout = _parse_number(name, raw, float, 0)
    name, raw = pick("sink_queue_spans", ENV_SINK_QUEUE_SPANS, DEFAULT_SINK_QUEUE_SPANS)
    sink_queue = _parse_number(name, raw, int, 1)
    name, raw = pick("export_timeout_s", None, None)
    if raw is None:
        raw_ms = env.get(ENV_EXPORT_TIMEOUT, "") or DEFAULT_EXPORT_TIMEOUT_MS
        export_timeout = _parse_number(ENV_EXPORT_TIMEOUT, raw_ms, float, 1) / 1000
    else:
        export_timeout = _parse_number(name, raw, float, 0.001)
    _, otlp = pick("otlp_endpoint", ENV_OTLP_TRACES_ENDPOINT, None)
    otlp = otlp or (
        env.get(ENV_OTLP_ENDPOINT) or None if kwargs.get("otlp_endpoint") is None else None
    )
    return Config(
        enabled=enabled,
        dir=trace_dir,
        run_id=run_id,
        service=str(service),
        resource=resource,
        flush_interval_s=interval,
        flush_spans=flush_spans,
        max_buffered=max_buffered,
        otlp_endpoint=otlp,
        host=host,
        max_buffered_bytes=max_bytes,
        shutdown_timeout_s=shutdown_timeout,
        sink_queue_spans=sink_queue,
        export_timeout_s=export_timeout,
        limits=span_limits(env),
    )


def resolve_sampling(
    sample_host: bool | None = None,
    sample_interval: float | None = None,
    env: Mapping[str, str] | None = None,
) -> tuple[bool, float]:
    """Host sampling settings: keyword arguments, then CHIPTRACE_SAMPLE_HOST /
    CHIPTRACE_SAMPLE_INTERVAL, then off and 0.1 s.

    CHIPTRACE_SAMPLE_HOST is ignored in a process whose ancestor already samples this
    host (CHIPTRACE_SAMPLER_PID names another pid): workers would only repeat its rows.

    Raises:
        ConfigError: a bad boolean, or an interval that is not a number >= 0.01 s.
    """
    env = os.environ if env is None else env
    if sample_host is not None:
        on = parse_bool("sample_host", sample_host)
    else:
        on = parse_bool(ENV_SAMPLE_HOST, env.get(ENV_SAMPLE_HOST, "") or "0")
        if on and env.get(ENV_SAMPLER_PID, str(os.getpid())) != str(os.getpid()):
            on = False
    if sample_interval is not None:
        interval = _parse_number("sample_interval", sample_interval, float, MIN_SAMPLE_INTERVAL_S)
    elif env.get(ENV_SAMPLE_INTERVAL, "") != "":
        raw = env[ENV_SAMPLE_INTERVAL]
        interval = _parse_number(ENV_SAMPLE_INTERVAL, raw, float, MIN_SAMPLE_INTERVAL_S)
    else:
        interval = DEFAULT_SAMPLE_INTERVAL_S
    return on, interval
