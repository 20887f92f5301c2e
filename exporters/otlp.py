"""OTLP export: stored spans to Jaeger (or any OTLP receiver) over HTTP/protobuf or gRPC.

Two entry points:

- `export_batches` / `export_dirs`: a one-shot export of a trace (what `chiptrace export
  DIR --otlp URL` runs). Fails with `ExportError` saying how many spans were sent.
- `OtlpSink`: a recorder sink that streams spans live while they are also stored
  (`chiptrace.init(otlp_endpoint=...)` or `OTEL_EXPORTER_OTLP_ENDPOINT`). It sends from its
  own thread, so a slow or dead collector never holds up the Parquet store; when its queue
  is full it drops and counts, like the SDK's BatchSpanProcessor.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from chiptrace._queue import BoundedQueue
from chiptrace.exporters.otlp_config import ENV_TRACES_ENDPOINT, OtlpSettings, resolve
from chiptrace.exporters.otlp_encode import encode_spans, requests
from chiptrace.exporters.otlp_transport import ExportError, make_transport, send_with_retry
from chiptrace.exporters.source import SpanFilter, SpanSource

log = logging.getLogger("chiptrace")

DEFAULT_BATCH_SPANS = 2048  # spans per request: ~0.5 MB, well under gRPC's 4 MB default


@dataclass
class ExportResult:
    """What an export did."""

    spans: int
    requests: int
    rejected: int
    seconds: float
    url: str

    @property
    def spans_per_s(self) -> float:
        return self.spans / self.seconds if self.seconds > 0 else float("inf")


def export_batches(
    batches: Iterable[pa.RecordBatch],
    settings: OtlpSettings,
    *,
    total: int | None = None,
    batch_spans: int = DEFAULT_BATCH_SPANS,
    retries: int = 5,
    backoff_s: float = 0.25,
    progress: Callable[[int], None] | None = None,
) -> ExportResult:
    """Encode span batches straight from their columns and send them.

    Args:
        batches: span record batches (the store schema or DuckDB's plain-typed copy).
        settings: endpoint and options (see `otlp_config.resolve`).
        total: spans expected, for the error message.
        batch_spans: spans per OTLP request.
        retries, backoff_s: transient-failure policy per request.
        progress: called with the number of spans after each request is acknowledged.

    Raises:
        ExportError: the endpoint failed for good; the message says how many spans got there.
    """
    transport = make_transport(settings)
    sent = reqs = rejected = 0
    t0 = time.perf_counter()
    try:
        for batch in _whole_requests(batches, batch_spans):
            for body, n in requests(encode_spans(batch), batch_spans):
                try:
                    rejected += send_with_retry(
                        transport, body, retries=retries, backoff_s=backoff_s
                    )
                except ExportError as e:
                    of = f" of {total}" if total is not None else ""
                    raise ExportError(
                        f"OTLP export to {settings.url} failed: {e}; sent {sent}{of} spans"
                    ) from e
                sent += n
                reqs += 1
                if progress:
                    progress(n)
    finally:
        transport.close()
    return ExportResult(sent, reqs, rejected, time.perf_counter() - t0, settings.url)


def _whole_requests(batches: Iterable[pa.RecordBatch], size: int) -> Iterable[pa.Table]:
    """Regroup batches so every request but the last is full (DuckDB cuts per file)."""
    held: list[pa.RecordBatch] = []
    rows = 0
    for batch in batches:
        if not batch.num_rows:
            continue
        held.append(batch)
        rows += batch.num_rows
        if rows >= size:
            table = pa.Table.from_batches(held)
            cut = rows - rows % size
            yield table.slice(0, cut)
            held = table.slice(cut).to_batches()
            rows -= cut
    if rows:
        yield pa.Table.from_batches(held)


def export_dirs(
    dirs: str | os.PathLike[str] | Iterable[str | os.PathLike[str]],
    endpoint: str | None = None,
    *,
    span_filter: SpanFilter | None = None,
    **kwargs: Any,
) -> ExportResult:
    """Export the (filtered) spans of trace dirs to an OTLP endpoint.

    Args:
        dirs: trace directories.
        endpoint: `http(s)://host:port[/v1/traces]` or `grpc://host:port`; None reads
            OTEL_EXPORTER_OTLP_TRACES_ENDPOINT / OTEL_EXPORTER_OTLP_ENDPOINT.
        span_filter: which spans.
        **kwargs: passed to `export_batches`.
    """
    settings = resolve(endpoint)
    source = SpanSource(dirs, span_filter)
    return export_batches(source.batches(), settings, total=source.count, **kwargs)


class OtlpSink:
    """A recorder sink that streams every flushed batch to an OTLP endpoint.

    Args:
        endpoint: as `export_dirs` takes it; None uses the OTEL_EXPORTER_OTLP_* variables.
        max_queued_spans: spans held while the endpoint is slow; beyond, batches drop.
        retries: transient-failure retries per request (kept low: live data goes stale).
        batch_spans: spans per OTLP request.
    """

    queued = True  # its own bounded queue and thread: the recorder runs it as it is

    def __init__(
        self,
        endpoint: str | None = None,
        *,
        max_queued_spans: int = 200_000,
        retries: int = 2,
        batch_spans: int = DEFAULT_BATCH_SPANS,
    ) -> None:
        if endpoint and endpoint == os.environ.get(ENV_TRACES_ENDPOINT, "").strip():
            endpoint = None  # init() passed the signal-specific variable on: use it as given
        self.settings = resolve(endpoint)
        self.retries = retries
        self.batch_spans = batch_spans
        self.max_queued_spans = max_queued_spans
        self.sent = self.failed = 0
        self._sending = 0  # spans of the batch being sent
        self._left_behind = 0  # spans of a send still running when close() gave up
        self._queue: BoundedQueue[pa.RecordBatch] = BoundedQueue(max_queued_spans)
        self._transport = make_transport(self.settings)
        self._thread = threading.Thread(target=self._run, name="chiptrace-otlp", daemon=True)
        self._thread.start()

    @property
    def dropped(self) -> int:
        """Spans dropped: the queue was full, or still held (or being sent) at close."""
        return self._queue.dropped + self._left_behind

    def write(self, batch: pa.RecordBatch) -> None:
        """Queue a batch for sending; never blocks, drops (and counts) when the queue is full."""
        self._queue.put(batch)

    def flush(self, timeout_s: float = 30.0) -> bool:
        """Wait until everything queued was sent (or failed). Returns False on timeout."""
        return self._queue.join(timeout_s)

    def close(self, timeout_s: float = 5.0) -> None:
        """Send what is queued, waiting at most `timeout_s` (a dead endpoint must not hold
        up the program's exit), then stop; what is left is counted as dropped."""
        flushed = self.flush(timeout_s=timeout_s)
        self._queue.close(drop_pending=not flushed)
        self._thread.join(timeout=0 if not flushed else timeout_s)
        if self._thread.is_alive():
            self._left_behind = self._sending
        self._transport.close()
        if self.dropped or self.failed:
            log.warning(
                "chiptrace: OTLP sink to %s: %d spans sent, %d dropped, %d failed",
                self.settings.url,
                self.sent,
                self.dropped,
                self.failed,
            )

    def _run(self) -> None:
        while (batch := self._queue.get()) is not None:
            self._sending = batch.num_rows
            try:
                self._send(batch)
            finally:
                self._sending = 0
                self._queue.task_done(batch)

    def _send(self, batch: pa.RecordBatch) -> None:
        done = 0
        try:
            for body, n in requests(encode_spans(batch), self.batch_spans):
                send_with_retry(self._transport, body, retries=self.retries)
                done += n
        except Exception as e:  # noqa: BLE001 - a live sink logs, it never raises into the recorder
            self.failed += batch.num_rows - done
            log.warning("chiptrace: OTLP export to %s failed: %s", self.settings.url, e)
        finally:
            self.sent += done
