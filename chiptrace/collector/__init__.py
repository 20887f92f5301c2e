"""The OTLP collector: receive spans from any OpenTelemetry SDK and store them as Parquet.

- `decode`: OTLP requests (protobuf, JSON) -> span RecordBatches (`wire` reads the bytes).
- `receiver.OtlpReceiver`: OTLP/HTTP and OTLP/gRPC servers on 127.0.0.1 that hand each
  decoded batch to a callback (the collector's store, or the viewer's live feed).
- `sink.PartitionedStoreSink`: the store, optionally hive-partitioned by date and host.

`chiptrace collect` (chiptrace/cli/collect.py) puts them together; docs/collect.md.
"""

from __future__ import annotations

from chiptrace.collector.decode import DecodeError, decode
from chiptrace.collector.receiver import OtlpReceiver

__all__ = ["DecodeError", "OtlpReceiver", "decode"]
