"""A collector: the OTLP receiver, the spool and the store, put together.

`chiptrace collect` and `chiptrace view --otlp` both run one. A request is acknowledged
once its spans are in the spool, and the spool writes everything it took (or says, at
stop, what it could not); `stop()` returns what was stored.
"""

from __future__ import annotations

import logging
import signal
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from chiptrace.collector.budget import DEFAULT_MAX_MEMORY, MemoryPlan
from chiptrace.collector.compact import drop_merged
from chiptrace.collector.receiver import (
    DEFAULT_HEADER_TIMEOUT_S,
    DEFAULT_MAX_CONNECTIONS,
    DEFAULT_MAX_REQUEST_BYTES,
    DEFAULT_MIN_BODY_RATE,
    DEFAULT_READ_TIMEOUT_S,
    OtlpReceiver,
    parse_address,
)
from chiptrace.collector.sink import PartitionedStoreSink
from chiptrace.collector.spool import Spool, SpoolLimits
from chiptrace.collector.wal import WriteAheadLog
from chiptrace.collector.wal_replay import replay
from chiptrace.errors import ConfigError, StoreError
from chiptrace.store import PartWriter

log = logging.getLogger("chiptrace")

FLUSH_S = 2.0
PARTITIONED_FLUSH_S = 30.0


@dataclass(frozen=True)
class CollectOptions:
    """Everything a collector is configured with (the `chiptrace collect` flags)."""

    out: Path
    http: str | None = "127.0.0.1:4318"
    grpc: str | None = None
    partition_by: tuple[str, ...] = ()
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES
    flush_interval_s: float | None = None  # None: 2 s, or PARTITIONED_FLUSH_S partitioned
    flush_spans: int = 200_000
    max_buffered: int = 2_000_000
    max_memory: int = DEFAULT_MAX_MEMORY
    min_free_bytes: int = 64 << 20
    read_timeout_s: float = DEFAULT_READ_TIMEOUT_S
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    max_connections_per_client: int | None = None
    header_timeout_s: float = DEFAULT_HEADER_TIMEOUT_S
    min_body_rate: int = DEFAULT_MIN_BODY_RATE
    manifest: Mapping[str, Any] = field(default_factory=dict)

    @property
    def flush_interval(self) -> float:
        """Seconds between parts: a partitioned store writes one file per partition per
        part, so it writes them less often (1,000 hosts flushed every 2 s made 500 files a
        second, and a 10-second run took 23 s to count)."""
        if self.flush_interval_s is not None:
            return self.flush_interval_s
        return PARTITIONED_FLUSH_S if self.partition_by else FLUSH_S

    def validate(self) -> MemoryPlan:
        """Check every setting before anything is bound or written.

        Raises:
            ConfigError: a setting out of range, naming the flag and the value.
        """
        if not self.http and not self.grpc:
            raise ConfigError("--listen none without --grpc: nothing to receive on")
        for flag, addr, port in (("--listen", self.http, 4318), ("--grpc", self.grpc, 4317)):
            if addr:
                parse_address(flag, addr, port)
        positive = {
            "--max-request-bytes": self.max_request_bytes,
            "--flush-interval": self.flush_interval,
            "--flush-spans": self.flush_spans,
            "--max-buffered": self.max_buffered,
            "--read-timeout": self.read_timeout_s,
            "--max-connections": self.max_connections,
            "--max-connections-per-client": self.max_connections_per_client or 1,
            "--header-timeout": self.header_timeout_s,
            "--min-body-rate": self.min_body_rate,
        }
        for flag, value in positive.items():
            if not value > 0:
                raise ConfigError(f"{flag} {value}: expected a positive number")
        if self.min_free_bytes < 0:
            raise ConfigError(f"--min-free-mb {self.min_free_bytes >> 20}: expected 0 or more")
        return MemoryPlan.for_ceiling(self.max_memory)


@dataclass(frozen=True)
class CollectSummary:
    """What a collector did, counted when it stopped."""

    stored: int
    requests: int
    rejected: int
    bad_requests: int
    refused: int
    unwritten: int
    error: str
    recovered: int = 0

    def line(self) -> str:
        text = (
            f"stored {self.stored:,} spans from {self.requests:,} requests "
            f"({self.rejected:,} spans rejected, {self.bad_requests:,} bad requests, "
            f"{self.refused:,} refused with 503)"
        )
        if self.recovered:
            text += (
                f"; before that, {self.recovered:,} spans a stopped collector had acknowledged "
                "and not written, from its write-ahead log"
            )
        if self.unwritten:
            text += (
                f"; {self.unwritten:,} acknowledged spans could NOT be written yet ({self.error}):"
                " they stay in the write-ahead log for the next collect on this directory"
            )
        return text


class Collector:
    """Receives OTLP and stores it in `options.out`.

    Args:
        options: the settings (see CollectOptions.validate for what is checked).
        on_accept: also called with each batch once the spool took it (the viewer's feed).

    Raises:
        ConfigError: bad options. StoreError: the output cannot be created.
    """

    def __init__(
        self,
        options: CollectOptions,
        on_accept: Callable[[pa.RecordBatch], None] | None = None,
    ) -> None:
        plan = options.validate()
        self.options = options
        self.on_accept = on_accept
        self.writer = PartWriter(
            options.out, manifest={"partition_by": list(options.partition_by), **options.manifest}
        )
        self.sink = PartitionedStoreSink(self.writer, options.partition_by)
        # The log's lock first: a second collector on the directory must not replay it too.
        self.wal = WriteAheadLog(Path(options.out), self.writer.writer_id)
        try:
            drop_merged(Path(options.out))
            self.recovered = replay(
                Path(options.out), self.writer, options.partition_by, options.flush_spans
            )
        except (OSError, pa.ArrowException) as e:
            self.wal.close(0, lambda: None)
            raise StoreError(
                f"cannot store what the write-ahead log in {self.wal.folder} holds: {e}"
            ) from e
        limits = SpoolLimits(
            flush_interval_s=options.flush_interval,
            flush_spans=options.flush_spans,
            flush_bytes=plan.flush_bytes,
            max_spans=options.max_buffered,
            max_bytes=plan.spool,
            min_free_bytes=options.min_free_bytes,
            rotate_log=bool(options.partition_by),
        )
        self.spool = Spool(
            self.sink,
            limits,
            disk=Path(options.out),
            wal=self.wal,
            on_written=self._written,
        )
        self.receiver = OtlpReceiver(
            self._take,
            http=options.http,
            grpc=options.grpc,
            max_request_bytes=options.max_request_bytes,
            request_memory=plan.requests,
            read_timeout_s=options.read_timeout_s,
            max_connections=options.max_connections,
            max_connections_per_client=options.max_connections_per_client,
            header_timeout_s=options.header_timeout_s,
            min_body_rate=options.min_body_rate,
        )
        self._summary: CollectSummary | None = None

    def _written(self, last: int) -> None:
        """Parts hold every log record <= `last` (from the spool's thread): delete the log
        segments they free, then merge small parts whose records have left the log."""
        self.wal.release_through(last, self.sink.make_durable)
        compactor = self.sink.compactor
        if compactor is not None and not self.spool.closing:
            try:
                compactor.run(self.wal.released_through, stop=lambda: self.spool.pressed)
            except OSError as e:  # the parts stay as they are; the store is whole
                log.warning("chiptrace: could not compact the store: %s", e)

    def _take(self, batch: pa.RecordBatch) -> None:
        self.sink.prepare(batch)
        self.spool.offer(batch)
        if self.on_accept is not None:
            self.on_accept(batch)

    def start(self) -> Collector:
        """Bind and serve.

        Raises:
            ConfigError: an address cannot be bound (the spool is closed then).
        """
        try:
            self.receiver.start()
        except BaseException:
            self.spool.close()
            self.wal.close(self.spool.written_through, self.sink.make_durable)
            raise
        return self

    def stop(self) -> CollectSummary:
        """Stop acknowledging, write everything acknowledged, and say what was stored.
        Idempotent."""
        if self._summary is None:
            self.receiver.stop()
            self.spool.close()
            self.wal.close(self.spool.written_through, self.sink.make_durable)
            self.sink.close()
            updates = {"spans_unwritten": self.spool.unwritten} if self.spool.unwritten else {}
            try:
                self.writer.close(**updates)  # ended_unix_ns: a viewer following says ENDED
            except OSError:
                pass  # the spool already said the disk failed; the parts are what counts
            s = self.receiver.stats
            self._summary = CollectSummary(
                stored=self.spool.stored,
                requests=s.requests,
                rejected=s.rejected,
                bad_requests=s.errors,
                refused=s.refused,
                unwritten=self.spool.unwritten,
                error=self.spool.last_error,
                recovered=self.recovered,
            )
        return self._summary


class StopFlag:
    """Set by SIGTERM / SIGINT (see `stop_on_signals`), read by a loop serving until then.

    A plain attribute: a handler that took a lock the interrupted thread holds would
    deadlock, and an exception raised from a handler (KeyboardInterrupt) lands wherever
    the main thread happens to be, a lock or a half-done update included.
    """

    def __init__(self) -> None:
        self.requested = False

    def set(self, *_: Any) -> None:
        self.requested = True


def stop_on_signals(flag: StopFlag) -> None:
    """Make SIGTERM and SIGINT set `flag` (call from the main thread).

    Also when the parent ignored or blocked them, which a child inherits: Python then
    installs no KeyboardInterrupt for SIGINT (a `cmd &` from a script, a test runner that
    ignores SIGINT), and `view --otlp` used to run on after SIGINT.
    """
    stops = (signal.SIGTERM, signal.SIGINT)
    for sig in stops:
        signal.signal(sig, flag.set)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, stops)
