"""OTLP/HTTP into the viewer: `chiptrace view --otlp [HOST:PORT]`.

The receiving is `chiptrace.collector.OtlpReceiver` (protobuf, JSON, gzip; 4xx on bad
input), the same one `chiptrace collect` runs. Each decoded request goes to the viewer's
feed at once, and to a recorder that stores it as Parquet parts (in `--out DIR`, or in a
temporary dir the explorer and SQL console read, removed at exit).
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

import pyarrow as pa

from chiptrace.collector.receiver import OtlpReceiver
from chiptrace.collector.receiver import parse_address as _parse
from chiptrace.config import resolve
from chiptrace.recorder import Recorder, StoreSink
from chiptrace.store import PartWriter, read_manifests
from chiptrace.viewer.sources import SpanFeed


def parse_address(text: str) -> tuple[str, int]:
    """`HOST:PORT`, `:PORT` or `PORT` (host 127.0.0.1).

    Raises:
        ConfigError: not a host and a port in 0..65535.
    """
    return _parse("--otlp", text, 4318)


class OtlpSource:
    """Receives OTLP/HTTP on host:port; a viewer source (see `sources.Source`).

    Args:
        host: the address to listen on (127.0.0.1: this machine only).
        port: the port (0: a free one; read `.port`).
        out: a trace dir to store the spans in; None stores into a temporary dir.
    """

    def __init__(
        self, host: str = "127.0.0.1", port: int = 4318, out: str | Path | None = None
    ) -> None:
        self.feed = SpanFeed()
        self.receiver = OtlpReceiver(self.take, http=f"{host}:{port}").start()
        self.port = self.receiver.http_port
        self.host = host
        self.name = f"otlp {host}:{self.port}"
        self._tmp = None if out else tempfile.mkdtemp(prefix="chiptrace-view-")
        self.store_dir = Path(out or self._tmp)
        self.writer = PartWriter(self.store_dir, manifest={"source": "chiptrace view --otlp"})
        config = resolve(dir=self.store_dir, service="chiptrace-view", flush_interval_s=1.0)
        self.recorder = Recorder(config, [StoreSink(self.writer)], self.writer)

    def take(self, batch: pa.RecordBatch) -> None:
        """A decoded request: to the screen now, to the store on the next flush."""
        if batch.num_rows:
            self.feed.write(batch)
            self.recorder.write_batch(batch, block=False)

    def poll(self, feed: SpanFeed) -> None:
        if feed is not self.feed:  # a viewer with its own feed: forward
            for b in self.feed.drain():
                feed.write(b)

    def manifests(self) -> list[dict[str, Any]]:
        return read_manifests([self.store_dir])

    def serve_summary(self, window_ns: int | None) -> int:
        """--no-ui: receive until interrupted, then print the dashboard as text."""
        import time

        from chiptrace.viewer.alerts import derive_alerts
        from chiptrace.viewer.launch import summary_text
        from chiptrace.viewer.model import LiveModel

        model = LiveModel()
        print(
            f"chiptrace: receiving OTLP/HTTP on http://{self.host}:{self.port}/v1/traces (Ctrl-C ends)",
            flush=True,
        )
        try:
            while True:
                time.sleep(0.2)
                for b in self.feed.drain():
                    model.ingest(b)
        except KeyboardInterrupt:
            pass
        snap = model.snapshot(window_ns or 1_000_000_000)
        print(summary_text(snap, derive_alerts(snap)))
        return 0

    def stop(self) -> None:
        """Stop listening, store what is buffered, remove a temporary store."""
        self.receiver.stop()
        self.recorder.shutdown()
        if self._tmp:
            shutil.rmtree(self._tmp, ignore_errors=True)


__all__ = ["OtlpSource", "parse_address"]
