"""The OTLP collector: receive spans from any OpenTelemetry SDK and store them as Parquet.

- `decode`: OTLP requests (protobuf, JSON) -> span RecordBatches (`span_reader` reads the bytes, `_span_scan` scans its spans).
- `receiver.OtlpReceiver`: OTLP/HTTP (`otlp_http`) and OTLP/gRPC (`otlp_grpc`) servers on
  127.0.0.1 that hand each decoded batch to a callback, within a memory `budget`.
- `spool.Spool`: spans acknowledged and not yet written; writes all it took, or refuses.
- `sink.PartitionedStoreSink`: the store, optionally hive-partitioned by date, host, service.
- `service.Collector`: the four together, as `chiptrace collect` and `view --otlp` run them.

docs/collect.md says what is acknowledged, refused and stored.
"""

from __future__ import annotations

from chiptrace.collector.decode import DecodeError, decode
from chiptrace.collector.receiver import OtlpReceiver

__all__ = ["DecodeError", "OtlpReceiver", "decode"]
