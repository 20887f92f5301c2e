"""The OTLP collector: receive spans from any OpenTelemetry SDK and store them as Parquet.

- `decode`: OTLP requests (protobuf, JSON) -> span RecordBatches.
- `receiver.OtlpReceiver`: OTLP/HTTP and OTLP/gRPC servers on 127.0.0.1 that hand each
  decoded batch to a callback (the collector's store, or the viewer's live feed).
- `sink.PartitionedStoreSink`: the store, optionally hive-partitioned by date and host.
"""

from __future__ import annotations

__all__ = ["decode", "receiver", "sink"]
