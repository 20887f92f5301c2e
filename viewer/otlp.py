"""OTLP/HTTP into the viewer: `chiptrace view --otlp [HOST:PORT]`.

The receiving and storing is a `chiptrace.collector.service.Collector`, the one `chiptrace
collect` runs (protobuf, JSON, gzip, chunked; 4xx on bad input; 503 when it cannot store),
writing to `--out DIR` or to a temporary dir the explorer and SQL console read (removed at
exit). Each request it acknowledges also goes to the viewer's feed at once.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from chiptrace.collector.receiver import parse_address as _parse
from chiptrace.collector.service import CollectOptions, Collector, CollectSummary, StopFlag
from chiptrace.store import read_manifests
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
        self._tmp: str | None = None  # a temporary store, removed on stop
        if out:
            self.store_dir = Path(out)
        else:
            self._tmp = tempfile.mkdtemp(prefix="chiptrace-view-")
            self.store_dir = Path(self._tmp)
        options = CollectOptions(
            out=self.store_dir,
            http=f"{host}:{port}",
            flush_interval_s=1.0,
            manifest={"source": "chiptrace view --otlp"},
        )
        self.collector = Collector(options, on_accept=self.feed.write).start()
        self.receiver = self.collector.receiver
        self.port = self.receiver.http_port
        self.host = host
        self.name = f"otlp {host}:{self.port}"

    def poll(self, feed: SpanFeed) -> None:
        if feed is not self.feed:  # a viewer with its own feed: forward
            for b in self.feed.drain():
                feed.write(b)

    def manifests(self) -> list[dict[str, Any]]:
        return read_manifests([self.store_dir])

    def backlog(self) -> tuple[int | None, int]:
        return None, 0  # spans reach the feed as they are received

    def serve_summary(self, window_ns: int | None, stop: StopFlag) -> int:
        """--no-ui: receive until `stop` is set, then print the dashboard as text."""
        from chiptrace.viewer.alerts import derive_alerts
        from chiptrace.viewer.launch import summary_text
        from chiptrace.viewer.live_model import LiveModel

        model = LiveModel()
        print(
            f"chiptrace: receiving OTLP/HTTP on http://{self.host}:{self.port}/v1/traces "
            "(Ctrl-C or SIGTERM ends)",
            flush=True,
        )
        while not stop.requested:
            time.sleep(0.1)
            for b in self.feed.drain():
                model.ingest(b)
        for b in self.feed.drain():
            model.ingest(b)
        snap = model.snapshot(window_ns or 1_000_000_000)
        print(summary_text(snap, derive_alerts(snap)))
        return 0

    @property
    def ended(self) -> bool:
        return False  # a receiver ends only when stopped

    def stop(self) -> CollectSummary:
        """Stop listening, store every acknowledged span, remove a temporary store."""
        summary = self.collector.stop()
        if self._tmp:
            shutil.rmtree(self._tmp, ignore_errors=True)
        return summary


__all__ = ["OtlpSource", "parse_address"]
