"""OTLP exporter settings, resolved the way OpenTelemetry's exporters resolve them.

Order: keyword arguments, then `OTEL_EXPORTER_OTLP_TRACES_*`, then `OTEL_EXPORTER_OTLP_*`,
then defaults. Per the OTLP exporter specification a signal-specific endpoint is used as
given while the generic one gets `/v1/traces` appended for HTTP; `--otlp URL` on the command
line is treated as a generic (base) endpoint unless it already ends in `/v1/traces`.
`grpc://host:port` (and `grpcs://`) pick OTLP/gRPC whatever OTEL_EXPORTER_OTLP_PROTOCOL says.
Timeouts are milliseconds in the environment (the specification's unit).
"""

from __future__ import annotations

import os
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, field

from chiptrace.errors import ConfigError

ENV_ENDPOINT = "OTEL_EXPORTER_OTLP_ENDPOINT"
ENV_TRACES_ENDPOINT = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
ENV_HEADERS = "OTEL_EXPORTER_OTLP_HEADERS"
ENV_TRACES_HEADERS = "OTEL_EXPORTER_OTLP_TRACES_HEADERS"
ENV_COMPRESSION = "OTEL_EXPORTER_OTLP_COMPRESSION"
ENV_TRACES_COMPRESSION = "OTEL_EXPORTER_OTLP_TRACES_COMPRESSION"
ENV_TIMEOUT = "OTEL_EXPORTER_OTLP_TIMEOUT"
ENV_TRACES_TIMEOUT = "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT"
ENV_PROTOCOL = "OTEL_EXPORTER_OTLP_PROTOCOL"
ENV_TRACES_PROTOCOL = "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"
ENV_INSECURE = "OTEL_EXPORTER_OTLP_INSECURE"

DEFAULT_HTTP_ENDPOINT = "http://localhost:4318"
DEFAULT_GRPC_ENDPOINT = "http://localhost:4317"
DEFAULT_TIMEOUT_S = 10.0
TRACES_PATH = "/v1/traces"
PROTOCOLS = ("http/protobuf", "grpc")
COMPRESSIONS = ("none", "gzip")


@dataclass(frozen=True)
class OtlpSettings:
    """Where and how to send OTLP.

    Attributes:
        protocol: `http/protobuf` or `grpc`.
        url: for HTTP the full URL of the traces endpoint; for gRPC `scheme://host:port`.
        headers: extra request headers (gRPC metadata keys are lowercased).
        compression: `gzip` or `none`.
        timeout_s: per-request deadline.
        insecure: gRPC without TLS (the default for http:// and grpc:// endpoints).
    """

    protocol: str
    url: str
    headers: Mapping[str, str] = field(default_factory=dict)
    compression: str = "none"
    timeout_s: float = DEFAULT_TIMEOUT_S
    insecure: bool = True

    @property
    def target(self) -> str:
        """`host:port` for gRPC channels."""
        parsed = urllib.parse.urlsplit(self.url)
        port = parsed.port or (443 if parsed.scheme in ("https", "grpcs") else 4317)
        return f"{parsed.hostname}:{port}"


def parse_headers(name: str, raw: str) -> dict[str, str]:
    """`k1=v1,k2=v2` with URL-encoded values (W3C Baggage style, per the OTel spec)."""
    headers: dict[str, str] = {}
    for item in filter(None, (p.strip() for p in raw.split(","))):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"{name}: {item!r} is not key=value")
        headers[urllib.parse.unquote(key.strip())] = urllib.parse.unquote(value.strip())
    return headers


def _first(env: Mapping[str, str], *names: str) -> tuple[str, str] | None:
    for n in names:
        if env.get(n, "").strip():
            return n, env[n].strip()
    return None


def _protocol(url: str, env: Mapping[str, str], protocol: str | None) -> str:
    scheme = urllib.parse.urlsplit(url).scheme
    if scheme in ("grpc", "grpcs"):
        return "grpc"
    if protocol is None:
        found = _first(env, ENV_TRACES_PROTOCOL, ENV_PROTOCOL)
        protocol = found[1] if found else "http/protobuf"
    if protocol not in PROTOCOLS:
        raise ConfigError(f"OTLP protocol {protocol!r}: expected one of {', '.join(PROTOCOLS)}")
    return protocol


def _check_url(name: str, url: str) -> str:
    parsed = urllib.parse.urlsplit(url)
    if parsed.scheme not in ("http", "https", "grpc", "grpcs") or not parsed.hostname:
        raise ConfigError(
            f"{name}={url!r}: expected a URL like http://127.0.0.1:4318 or grpc://127.0.0.1:4317"
        )
    try:
        parsed.port  # noqa: B018 - raises on a bad port
    except ValueError:
        raise ConfigError(f"{name}={url!r}: the port is not a number in 0..65535") from None
    return url


def _endpoint(
    endpoint: str | None, env: Mapping[str, str], protocol: str | None
) -> tuple[str, str]:
    """(protocol, url): explicit endpoints and the generic variable are base URLs."""
    if endpoint:
        url, base = _check_url("--otlp", endpoint), True
    elif found := _first(env, ENV_TRACES_ENDPOINT):
        url, base = _check_url(*found), False
    elif found := _first(env, ENV_ENDPOINT):
        url, base = _check_url(*found), True
    else:
        proto = _protocol("http://x", env, protocol)
        base = True
        url = DEFAULT_GRPC_ENDPOINT if proto == "grpc" else DEFAULT_HTTP_ENDPOINT
    proto = _protocol(url, env, protocol)
    if proto == "http/protobuf" and base and not url.rstrip("/").endswith(TRACES_PATH):
        url = url.rstrip("/") + TRACES_PATH
    return proto, url


def resolve(
    endpoint: str | None = None,
    *,
    headers: Mapping[str, str] | None = None,
    compression: str | None = None,
    timeout_s: float | None = None,
    protocol: str | None = None,
    env: Mapping[str, str] | None = None,
) -> OtlpSettings:
    """Resolve OTLP settings from arguments, the OTEL_EXPORTER_OTLP_* variables, defaults.

    Raises:
        ConfigError: a malformed endpoint, header list, compression, timeout or protocol.
    """
    env = os.environ if env is None else env
    proto, url = _endpoint(endpoint, env, protocol)
    all_headers: dict[str, str] = {}
    for var in (ENV_HEADERS, ENV_TRACES_HEADERS):  # the signal-specific one wins
        if env.get(var):
            all_headers.update(parse_headers(var, env[var]))
    all_headers.update(headers or {})
    if compression is None:
        found = _first(env, ENV_TRACES_COMPRESSION, ENV_COMPRESSION)
        compression = found[1].lower() if found else "none"
    if compression not in COMPRESSIONS:
        raise ConfigError(
            f"OTLP compression {compression!r}: expected one of {', '.join(COMPRESSIONS)}"
        )
    if timeout_s is None:
        found = _first(env, ENV_TRACES_TIMEOUT, ENV_TIMEOUT)
        timeout_s = _timeout_ms(*found) / 1000 if found else DEFAULT_TIMEOUT_S
    if timeout_s <= 0:
        raise ConfigError(f"OTLP timeout {timeout_s!r}: expected a positive number of seconds")
    scheme = urllib.parse.urlsplit(url).scheme
    insecure = scheme in ("http", "grpc")
    if found := _first(env, ENV_INSECURE):
        insecure = insecure or found[1].lower() in ("1", "true", "yes", "on")
    return OtlpSettings(proto, url, all_headers, compression, float(timeout_s), insecure)


def _timeout_ms(name: str, raw: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r}: expected milliseconds, for example 10000") from None
    if value <= 0:
        raise ConfigError(f"{name}={raw!r}: expected a positive number of milliseconds")
    return value
