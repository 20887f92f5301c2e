"""Retry tickets of the memory budget: refused gRPC requests are queued in time."""

from __future__ import annotations

import pytest
from google.rpc.error_details_pb2 import RetryInfo

from chiptrace.collector.budget import RETRY_SPREAD_S, MemoryBudget
from chiptrace.collector.otlp_grpc import retry_trailers

MB = 1 << 20


def test_refused_requests_get_tickets_one_service_time_apart() -> None:
    budget = MemoryBudget(100 * MB)
    assert 1 <= budget.retry_delay(100 * MB) <= RETRY_SPREAD_S  # nothing measured: random
    budget.done(100 * MB, 0.5)  # requests of the whole budget held it 0.5 s
    budget.done(1 * MB, 10.0)  # a small slow one weighs by its bytes
    hold = (100 * 0.5 + 1 * 10.0) / 101
    tickets = [budget.retry_delay(100 * MB) for _ in range(5)]
    steps = [b - a for a, b in zip(tickets, tickets[1:], strict=False)]
    assert tickets[0] == pytest.approx(hold * 1.2, rel=0.05)
    assert all(s == pytest.approx(hold * 1.2, rel=0.05) for s in steps), steps
    half = budget.retry_delay(50 * MB) - tickets[-1]  # half the budget: half the time
    assert half == pytest.approx(hold * 0.6, rel=0.05)
    for _ in range(200):  # never told to wait past the spread
        last = budget.retry_delay(100 * MB)
    assert last <= RETRY_SPREAD_S


def test_retry_info_carries_the_ticket_to_the_nanosecond() -> None:
    trailers = dict(retry_trailers("busy", 0.6))
    delay = RetryInfo.FromString(trailers["google.rpc.retryinfo-bin"]).retry_delay
    assert (delay.seconds, delay.nanos) == (0, 600_000_000)
    delay = RetryInfo.FromString(
        dict(retry_trailers("busy", 3))["google.rpc.retryinfo-bin"]
    ).retry_delay
    assert (delay.seconds, delay.nanos) == (3, 0)
