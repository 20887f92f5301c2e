"""OTLP/gRPC transport: `TraceService/Export` on a grpc server, answered as OTLP says.

A refused request (the store cannot take it, no memory to decode it) is UNAVAILABLE with a
retry delay in the two places clients look: `google.rpc.RetryInfo` in the standard
`grpc-status-details-bin` trailer (Go, Java, the OpenTelemetry Collector) and in
`google.rpc.retryinfo-bin` (the Python SDK). Both are encoded here by hand, four small
messages, rather than adding googleapis-common-protos to the install.
"""

from __future__ import annotations

import math
from concurrent import futures
from typing import TYPE_CHECKING, Any

from chiptrace._protowire import message_field, varint
from chiptrace.collector.budget import DECODE_FACTOR, BudgetExhausted
from chiptrace.collector.otlp_http import RequestError
from chiptrace.errors import ConfigError

if TYPE_CHECKING:
    from chiptrace.collector.receiver import OtlpReceiver

GRPC_SERVICE = "opentelemetry.proto.collector.trace.v1.TraceService"
# Handlers running at once, and RPCs the server takes at once: grpc receives a message
# before a handler sees it, so RPCs queued for a worker held their bodies outside any
# budget (100 clients of 10 MB grew RSS by 1.5 GB). Past the limit grpc answers
# RESOURCE_EXHAUSTED at once, which the SDKs retry with backoff.
GRPC_MIN_WORKERS, GRPC_MAX_WORKERS = 4, 32
_UNAVAILABLE = 14
_RESOURCE_EXHAUSTED = 8
_RETRY_INFO_URL = b"type.googleapis.com/google.rpc.RetryInfo"


def retry_trailers(
    message: str, retry_after_s: float, code: int = _UNAVAILABLE
) -> tuple[tuple[str, bytes], ...]:
    """Trailing metadata telling a client to retry (UNAVAILABLE) after `retry_after_s`."""
    seconds = int(max(0.0, retry_after_s))
    nanos = int((max(0.0, retry_after_s) - seconds) * 1e9)
    duration = b"\x08" + varint(seconds)  # Duration.seconds (written even when 0)
    if nanos:
        duration += b"\x10" + varint(nanos)  # Duration.nanos: tickets are finer than 1 s
    retry_info = message_field(1, duration)  # RetryInfo.retry_delay
    detail = message_field(1, _RETRY_INFO_URL) + message_field(2, retry_info)  # Any
    status = (
        b"\x08"
        + varint(code)
        + message_field(2, message.encode("utf-8"))
        + message_field(3, detail)  # google.rpc.Status
    )
    return (("grpc-status-details-bin", status), ("google.rpc.retryinfo-bin", retry_info))


def start_grpc(receiver: OtlpReceiver, host: str, port: int) -> tuple[Any, int]:
    """A started grpc server exporting to `receiver`, and its port.

    Raises:
        ConfigError: the address cannot be bound.
    """
    import grpc

    # As many RPCs as the budget holds largest requests, each with its own worker at once
    # (none waits in a queue holding its message).
    workers = receiver.budget.limit // max(1, receiver.max_request_bytes)
    workers = max(GRPC_MIN_WORKERS, min(GRPC_MAX_WORKERS, workers))
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="chiptrace-otlp-grpc"),
        options=[
            ("grpc.max_receive_message_length", receiver.max_request_bytes),
            # Flow control at its 64 kB default: with BDP probing, grpc widened each
            # stream's window and took in refused RPCs' bodies whole (+923 MiB RSS for
            # 100 clients of 10 MB).
            ("grpc.http2.bdp_probe", 0),
        ],
        maximum_concurrent_rpcs=workers,
    )
    handler = grpc.unary_unary_rpc_method_handler(lambda req, ctx: _export(receiver, req, ctx))
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(GRPC_SERVICE, {"Export": handler}),)
    )
    try:
        bound = server.add_insecure_port(f"{host}:{port}")
    except RuntimeError as e:
        raise ConfigError(f"cannot listen on {host}:{port} for gRPC: {e}") from e
    server.start()
    return server, bound


def _refuse(
    receiver: OtlpReceiver, context: Any, exhausted: BudgetExhausted, retry_after_s: int = 0
) -> None:
    """RESOURCE_EXHAUSTED with RetryInfo: the SDKs retry it after the delay given."""
    import grpc

    delay = retry_after_s or receiver.budget.retry_delay(exhausted.want)
    e = RequestError(503, str(exhausted), retry_after_s=math.ceil(delay))
    receiver.stats.fail(e.status)
    context.set_trailing_metadata(retry_trailers(str(e), delay, _RESOURCE_EXHAUSTED))
    context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(e))


def _export(receiver: OtlpReceiver, request: bytes, context: Any) -> bytes:
    import grpc

    try:
        with receiver.budget.reservation() as reservation:
            # gRPC has read the message already: its bytes and its decoding, taken once.
            reservation.need(len(request) * (1 + DECODE_FACTOR))
            return receiver.response(
                receiver.handle(request, "application/x-protobuf", reservation)
            )
    except BudgetExhausted as exhausted:
        _refuse(receiver, context, exhausted)
    except RequestError as error:
        e = error
    receiver.stats.fail(e.status)
    if e.status == 400:
        context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
    elif e.status == 413:
        context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(e))
    context.set_trailing_metadata(retry_trailers(str(e), e.retry_after_s or 1))
    context.abort(grpc.StatusCode.UNAVAILABLE, str(e))
    raise AssertionError("grpc's abort raises")
