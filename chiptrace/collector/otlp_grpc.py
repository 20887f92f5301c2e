"""OTLP/gRPC transport: `TraceService/Export` on a grpc server, answered as OTLP says.

A refused request (the store cannot take it, no memory to decode it) is UNAVAILABLE with a
retry delay in the two places clients look: `google.rpc.RetryInfo` in the standard
`grpc-status-details-bin` trailer (Go, Java, the OpenTelemetry Collector) and in
`google.rpc.retryinfo-bin` (the Python SDK). Both are encoded here by hand, four small
messages, rather than adding googleapis-common-protos to the install.
"""

from __future__ import annotations

from concurrent import futures
from typing import TYPE_CHECKING, Any

from chiptrace._protowire import message_field, varint
from chiptrace.collector.budget import BudgetExhausted
from chiptrace.collector.otlp_http import RequestError
from chiptrace.errors import ConfigError

if TYPE_CHECKING:
    from chiptrace.collector.receiver import OtlpReceiver

GRPC_SERVICE = "opentelemetry.proto.collector.trace.v1.TraceService"
# Handlers running at once. gRPC reads a request's message only when a worker takes it,
# so this also bounds the request bodies held in memory (each up to max_request_bytes).
GRPC_WORKERS = 4
_UNAVAILABLE = 14
_RETRY_INFO_URL = b"type.googleapis.com/google.rpc.RetryInfo"


def retry_trailers(message: str, retry_after_s: int) -> tuple[tuple[str, bytes], ...]:
    """Trailing metadata telling a client to retry UNAVAILABLE after `retry_after_s`."""
    duration = b"\x08" + varint(max(0, retry_after_s))  # Duration.seconds
    retry_info = message_field(1, duration)  # RetryInfo.retry_delay
    detail = message_field(1, _RETRY_INFO_URL) + message_field(2, retry_info)  # Any
    status = (
        b"\x08"
        + varint(_UNAVAILABLE)
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

    server = grpc.server(
        futures.ThreadPoolExecutor(
            max_workers=GRPC_WORKERS, thread_name_prefix="chiptrace-otlp-grpc"
        ),
        options=[("grpc.max_receive_message_length", receiver.max_request_bytes)],
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


def _export(receiver: OtlpReceiver, request: bytes, context: Any) -> bytes:
    import grpc

    try:
        with receiver.budget.reservation() as reservation:
            reservation.grow(len(request))
            return receiver.response(
                receiver.handle(request, "application/x-protobuf", reservation)
            )
    except BudgetExhausted as exhausted:
        e = RequestError(503, str(exhausted), retry_after_s=1)
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
