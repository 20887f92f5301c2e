"""The host sampler: a daemon thread that reads the real hardware at a fixed rate and
writes the readings as `metrics` parts into a trace directory.

It never blocks or crashes the program it watches: probes start on its own thread (NVML
can take a second to initialise), a probe that raises is logged once and left out, a
write that fails is logged and its rows counted as dropped, and the buffer is bounded.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import psutil

from chiptrace import config as _config
from chiptrace.host.metrics import (
    METRICS_TABLE,
    METRICS_WRITE_OPTIONS,
    SOURCE_REAL,
    SampleBuffer,
)
from chiptrace.host.probes import Probe, ProcessProbe, psutil_probes
from chiptrace.store import PartWriter

log = logging.getLogger("chiptrace")

DEFAULT_INTERVAL_S = _config.DEFAULT_SAMPLE_INTERVAL_S
DEFAULT_FLUSH_INTERVAL_S = 2.0
DEFAULT_MAX_BUFFERED = 500_000
MIN_FINAL_TICK_S = 0.005  # shorter windows give rates that are mostly rounding noise


class HostSampler:
    """Samples CPUs, memory, NICs, disks and (through NVML) GPUs into `DIR/metrics/`.

    Use as `with HostSampler(dir): ...`, or `start()` / `stop()`. `chiptrace.init(
    sample_host=True)` and `chiptrace record` run one for you.

    Args:
        directory: the trace directory (shared with the spans of the same run).
        interval: seconds between samples (default 0.1, i.e. 10 Hz; at least 0.01).
        run_id: the run the samples belong to, stamped on every row.
        service: recorded in the manifest.
        host: host name on every row (default: this machine's).
        nvml: also sample NVIDIA GPUs when NVML is present.
        flush_interval_s: seconds between Parquet parts.
        max_buffered: rows kept in memory at most while writes fail; more are dropped.
        manifest: extra facts for this writer's manifest.

    Raises:
        ConfigError: an interval below 0.01 s or not a number.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        interval: float = DEFAULT_INTERVAL_S,
        run_id: str | None = None,
        service: str | None = None,
        host: str | None = None,
        nvml: bool = True,
        flush_interval_s: float = DEFAULT_FLUSH_INTERVAL_S,
        max_buffered: int = DEFAULT_MAX_BUFFERED,
        manifest: Mapping[str, Any] | None = None,
    ) -> None:
        self.interval = check_interval(interval)
        self.directory = Path(directory)
        self.run_id = run_id
        self.service = service
        self.host = host or socket.gethostname()
        self.use_nvml = nvml
        self.flush_interval_s = flush_interval_s
        self.max_buffered = max_buffered
        self._extra = dict(manifest or {})
        self.nvml_status = "not started"
        self.ticks = 0
        self.rows_dropped = 0
        self.thread_cpu_s = 0.0
        self.probes: list[Probe] = []
        self.writer: PartWriter | None = None
        self._buf = SampleBuffer(self.host, run_id, os.getpid(), SOURCE_REAL)
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._lock = threading.Lock()  # the buffer
        self._write_lock = threading.Lock()  # parts and manifest: thread and stop() both write
        self._thread: threading.Thread | None = None
        self._warned: set[str] = set()
        self._pid = os.getpid()

    # ------------------------------------------------------------ lifecycle

    def start(self) -> HostSampler:
        """Create the metrics writer and start the sampling thread (idempotent).

        Raises:
            StoreError: the trace directory cannot be created.
        """
        if self._thread is not None:
            return self
        self.writer = PartWriter(
            self.directory,
            manifest=self._manifest(),
            table=METRICS_TABLE,
            write_options=METRICS_WRITE_OPTIONS,
        )
        self._pid = os.getpid()
        self._thread = threading.Thread(target=self._run, name="chiptrace-sampler", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        """Take no more samples, write what is buffered and the final manifest. Idempotent."""
        if self._thread is None or self._stop.is_set() or os.getpid() != self._pid:
            return  # not started, stopped, or a forked child's copy: the parent writes these
        self._stop.set()
        self._thread.join(timeout)
        self.flush()
        with self._write_lock:
            self._update_manifest(stopped_unix_ns=time.time_ns())

    def watch_process(self, pid: int) -> bool:
        """Also sample process `pid` and its descendants (`proc.*` metrics, device `pid:N`).

        Returns:
            False when the process is already gone or cannot be read.
        """
        try:
            probe = ProcessProbe(pid)
        except psutil.Error:
            return False
        self.probes.append(probe)
        return True

    def wait_ready(self, timeout: float = 10.0) -> bool:
        """Wait until the probes have started and taken their baseline (for tests)."""
        return self._ready.wait(timeout)

    def __enter__(self) -> HostSampler:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and not self._stop.is_set()

    @property
    def rows_written(self) -> int:
        return self.writer.rows_written if self.writer is not None else 0

    # ------------------------------------------------------------ the thread

    def _run(self) -> None:
        try:
            self._open_probes()
            self._ready.set()
            self._loop()
        except Exception as e:  # noqa: BLE001 - a sampler bug must not reach the program
            log.warning("chiptrace: host sampler stopped: %s: %s", type(e).__name__, e)
        finally:
            self._ready.set()
            self.thread_cpu_s = time.thread_time()
            for probe in self.probes:
                self._guard(probe.name, probe.close)

    def _loop(self) -> None:
        last = last_flush = time.monotonic()
        next_tick = last + self.interval
        while not self._stop.wait(max(0.0, next_tick - time.monotonic())):
            now = time.monotonic()
            self._tick(time.time_ns(), now - last)
            last = now
            if now - last_flush >= self.flush_interval_s:
                self.flush()
                last_flush = time.monotonic()
            next_tick += self.interval
            if next_tick < now:  # we fell behind (a stalled machine): skip, don't burst
                next_tick = now + self.interval
            self.thread_cpu_s = time.thread_time()
        # One last reading on stop, so counters (bytes sent, ...) cover the whole run.
        now = time.monotonic()
        if now - last > MIN_FINAL_TICK_S:
            self._tick(time.time_ns(), now - last)

    def _open_probes(self) -> None:
        self.probes[:0] = psutil_probes()  # in place: watch_process() may have added one
        if not self.use_nvml:
            self.nvml_status = "off"
            return
        from chiptrace.host.nvml import open_nvml

        probe, self.nvml_status = self._guard("nvml", open_nvml) or (None, "no NVML: failed")
        if probe is None:
            log.warning(
                "chiptrace: %s; GPU metrics off, sampling CPU, memory, NICs and disks",
                self.nvml_status,
            )
        else:
            self.probes.append(probe)

    def _tick(self, ts_ns: int, dt: float) -> None:
        samples = []
        for probe in list(self.probes):
            got = self._guard(probe.name, probe.sample, dt)
            if got is None:
                self.probes.remove(probe)
            else:
                samples += got
        with self._lock:
            if len(self._buf) + len(samples) > self.max_buffered:
                self.rows_dropped += len(samples)
            else:
                self._buf.add(ts_ns, samples)
        self.ticks += 1

    def _guard(self, name: str, fn: Any, *args: Any) -> Any:
        """Run fn; on an exception log once per probe and return None."""
        try:
            return fn(*args)
        except Exception as e:  # noqa: BLE001 - the sampled program must never see this
            if name not in self._warned:
                self._warned.add(name)
                log.warning("chiptrace: host probe %s failed, left out: %s", name, e)
            return None

    # ------------------------------------------------------------ writing

    def flush(self) -> int:
        """Write buffered samples as one metrics part; returns the rows written."""
        if os.getpid() != self._pid:
            return 0
        with self._write_lock:
            return self._flush()

    def _flush(self) -> int:
        with self._lock:
            n = len(self._buf)
            try:
                batch = self._buf.take()
            except Exception as e:  # noqa: BLE001 - rows that cannot be columns are lost, not fatal
                self.rows_dropped += n
                log.warning("chiptrace: host metrics dropped: %s", e)
                return 0
        if batch is None or self.writer is None:
            return 0
        try:
            self.writer.write(batch)
        except Exception as e:  # noqa: BLE001 - a full disk must not stop the program
            self.rows_dropped += batch.num_rows
            if "write" not in self._warned:
                self._warned.add("write")
                log.warning("chiptrace: could not write host metrics: %s", e)
            return 0
        self._update_manifest()
        return batch.num_rows

    def _manifest(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "service": self.service,
            "source": SOURCE_REAL,
            "sampler": {"interval_s": self.interval, "nvml": self.nvml_status},
            **self._extra,
        }

    def _update_manifest(self, **updates: Any) -> None:
        if self.writer is None:
            return
        sampler = {
            "interval_s": self.interval,
            "nvml": self.nvml_status,
            "probes": [p.name for p in self.probes],
            "ticks": self.ticks,
            "rows_dropped": self.rows_dropped,
            "thread_cpu_s": round(self.thread_cpu_s, 4),
        }
        try:
            self.writer.write_manifest(sampler=sampler, **updates)
        except OSError as e:
            log.warning("chiptrace: could not update metrics manifest: %s", e)


def check_interval(value: Any) -> float:
    """Validate a sampling interval in seconds (a number, at least 0.01).

    Raises:
        ConfigError: naming `sample_interval` and the bad value.
    """
    return _config.resolve_sampling(False, value, env={})[1]
