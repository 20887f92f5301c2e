"""A sink on its own bounded queue and thread, as the OpenTelemetry SDK's
BatchSpanProcessor runs an exporter: the recorder's writer hands it a table and moves on.

A user's SpanExporter or an OTLP endpoint can be slow, fail, or hang for good (a dead
collector behind a firewall that drops packets). On the writer thread it would hold up
the store; inline in the program it would hold up the program. Here it holds up nothing:
a full queue drops the table and counts its spans, an export that runs past the export
timeout marks the sink hung (later tables are dropped and counted at once, and flush()
stops waiting for it), and close() waits at most the time it is given; a thread still
stuck then is a daemon the interpreter abandons at exit. Every span the sink never
delivered is counted (`dropped`, `failed`), so the manifest can say so.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from chiptrace._queue import BoundedQueue

log = logging.getLogger("chiptrace")


class QueuedSink:
    """Wraps `sink` (anything with write(table) and close()) in a queue and a thread.

    Args:
        sink: the sink to feed.
        capacity: spans queued at most; beyond, tables drop (counted in `dropped`).
        export_timeout_s: one write longer than this marks the sink hung.
    """

    queued = True

    def __init__(self, sink: Any, capacity: int, export_timeout_s: float) -> None:
        self.sink = sink
        self.export_timeout_s = export_timeout_s
        self.errors = 0
        self.failed = 0  # spans of writes that raised (less what a sink says it delivered)
        self._writing = 0  # spans of the write in progress
        self._left_behind = 0  # spans of a write still running when close() gave up
        self._queue: BoundedQueue[Any] = BoundedQueue(capacity)
        self._busy_since: float | None = None
        self._hung_dropped = 0
        self._warned = False
        name = f"chiptrace-sink-{type(sink).__name__}"
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    @property
    def name(self) -> str:
        return type(self.sink).__name__

    @property
    def dropped(self) -> int:
        """Spans this sink never got: its queue was full, it hung, or close() gave up."""
        return self._queue.dropped + self._hung_dropped + self._left_behind

    @property
    def hung(self) -> bool:
        since = self._busy_since
        return since is not None and time.monotonic() - since > self.export_timeout_s

    def write(self, table: Any) -> None:
        """Queue a table; never blocks (drops and counts when full or hung)."""
        if self.hung:
            self._hung_dropped += len(table)
            self._warn_hung()
            return
        self._queue.put(table)

    def wait(self, timeout_s: float) -> bool:
        """Wait until what is queued was exported; False at once when hung, or on timeout."""
        deadline = time.monotonic() + max(timeout_s, 0.0)
        while not self.hung:
            left = deadline - time.monotonic()
            if self._queue.join(min(max(left, 0.0), 0.05)):
                return True
            if left <= 0:
                return False
        return False

    def close(self, timeout_s: float = 5.0) -> None:
        """Export what is queued and close the sink, within `timeout_s` in all."""
        deadline = time.monotonic() + max(timeout_s, 0.0)
        done = self.wait(timeout_s)
        self._queue.close(drop_pending=not done)
        self._thread.join(0.0 if self.hung else max(deadline - time.monotonic(), 0.0))
        if self._thread.is_alive():
            self._left_behind = self._writing
            log.warning(
                "chiptrace: sink %s did not finish within %.1f s; left behind", self.name, timeout_s
            )

    def _warn_hung(self) -> None:
        if not self._warned:
            self._warned = True
            log.warning(
                "chiptrace: sink %s has been exporting for over %.1f s; dropping its spans",
                self.name,
                self.export_timeout_s,
            )

    def _run(self) -> None:
        while (table := self._queue.get()) is not None:
            self._writing = len(table)
            self._busy_since = time.monotonic()
            try:
                self.sink.write(table)
            except Exception as e:  # noqa: BLE001 - a sink never stops its thread
                self.errors += 1
                self.failed += len(table) - getattr(e, "delivered", 0)
                if self.errors == 1:
                    log.warning("chiptrace: sink %s failed: %s", self.name, e)
            finally:
                self._busy_since = None
                self._writing = 0
                self._queue.task_done(table)
        try:
            self.sink.close()
        except Exception as e:  # noqa: BLE001
            log.warning("chiptrace: closing %s failed: %s", self.name, e)
