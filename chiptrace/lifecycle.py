"""Process lifecycle: `init()`, `flush()`, `shutdown()`, the zero-configuration start,
fork safety, and the host sampler beside the recorder.

The OTLP sink and the host sampler live in upper layers (chiptrace.exporters,
chiptrace.host) that the core must not import: their factories come in through
EXTENSIONS, which chiptrace/__init__.py fills before any of this can run.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import sys
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from chiptrace import config as _config
from chiptrace.errors import ConfigError
from chiptrace.recorder import Recorder, SpanSink, StoreSink, cancel_exit, on_exit
from chiptrace.recording import spans as _span
from chiptrace.recording.spans import _STATE


class Sampler(Protocol):
    """A started host sampler: it samples on its own thread until stopped."""

    def stop(self) -> None: ...


@dataclass
class Extensions:
    """Factories for what init() starts but the core may not import (see the module doc).

    Attributes:
        otlp_sink: the sink for `init(otlp_endpoint=...)`; unset, the OpenTelemetry SDK's
            OTLP/HTTP exporter is used.
        host_sampler: starts the sampler for `init(sample_host=True)`, given the config
            and the interval in seconds.
    """

    otlp_sink: Callable[[_config.Config], SpanSink] | None = None
    host_sampler: Callable[[_config.Config, float], Sampler] | None = None


EXTENSIONS = Extensions()


def init(
    dir: str | os.PathLike[str] | None = None,  # noqa: A002 - the natural name for users
    *,
    service: str | None = None,
    enabled: bool | None = None,
    exporters: Iterable[Any] = (),
    sinks: Iterable[SpanSink] = (),
    resource: Mapping[str, Any] | None = None,
    manifest: Mapping[str, Any] | None = None,
    flush_interval_s: float | None = None,
    flush_spans: int | None = None,
    max_buffered: int | None = None,
    otlp_endpoint: str | None = None,
    run_id: str | None = None,
    sample_host: bool | None = None,
    sample_interval: float | None = None,
) -> Recorder | None:
    """Configure tracing for this process; replaces (and flushes) any earlier recorder.

    Keyword arguments win over CHIPTRACE_* / OTEL_* variables, which win over defaults.
    Without init(), the first traced call configures from the environment and writes
    under ./chiptrace-traces/<run-id>/; its store, and NumPy and pyarrow with it, is set
    up on the writer thread at the first flush (2 s in, or at exit). init() sets it up
    now, so that ~0.2 s is paid before the program's work rather than beside it.

    Args:
        dir: the trace directory.
        service: service.name of the spans' resource.
        enabled: False makes traced calls cost a flag check and record nothing.
        exporters: OpenTelemetry SpanExporters that also receive every span.
        sinks: chiptrace sinks (Arrow batches) that also receive every span.
        resource: extra resource attributes.
        manifest: extra facts for the run manifest.
        flush_interval_s, flush_spans, max_buffered: buffer policy.
        otlp_endpoint: stream spans to this OTLP endpoint too (see chiptrace.exporters).
        run_id: names the default directory.
        sample_host: also sample the real host (CPUs, memory, NICs, disks, NVIDIA GPUs)
            on a daemon thread into the same dir's `metrics` table (chiptrace.host).
        sample_interval: seconds between host samples (default 0.1).

    Returns:
        The recorder, or None when tracing is disabled.

    Raises:
        ConfigError: a bad setting; StoreError: the directory cannot be created.
    """
    return _init(
        dir,
        service=service,
        enabled=enabled,
        exporters=exporters,
        sinks=sinks,
        resource=resource,
        manifest=manifest,
        flush_interval_s=flush_interval_s,
        flush_spans=flush_spans,
        max_buffered=max_buffered,
        otlp_endpoint=otlp_endpoint,
        run_id=run_id,
        sample_host=sample_host,
        sample_interval=sample_interval,
    )


def _init(
    dir: str | os.PathLike[str] | None = None,  # noqa: A002
    *,
    exporters: Iterable[Any] = (),
    sinks: Iterable[SpanSink] = (),
    manifest: Mapping[str, Any] | None = None,
    sample_host: bool | None = None,
    sample_interval: float | None = None,
    deferred: bool = False,
    **settings: Any,
) -> Recorder | None:
    """init(), and the zero-configuration start (`deferred`: the store, and with it
    NumPy and pyarrow, is set up on the writer thread at its first flush)."""
    sample_on, interval = _config.resolve_sampling(sample_host, sample_interval)
    cfg = _config.resolve(dir=dir, **settings)
    if cfg.enabled and not _gil_enabled():
        logging.getLogger("chiptrace").warning(
            "chiptrace: tracing disabled: this Python runs without the GIL "
            "(free-threaded build), which chiptrace's span buffer relies on"
        )
        cfg = dataclasses.replace(cfg, enabled=False)
    with _STATE.lock:
        old, _STATE.recorder = _STATE.recorder, None
        if old is not None:
            _release(old)
        _stop_sampler()
        _STATE.enabled = cfg.enabled
        _span.set_limits(cfg.limits)
        if not cfg.enabled:
            return None
        _STATE.recorder = _build_recorder(cfg, exporters, sinks, manifest, deferred)
        if sample_on:
            _STATE.sampler = _start_sampler(cfg, interval)
        return _STATE.recorder


def _gil_enabled() -> bool:
    """False on a free-threaded CPython running without its GIL (3.13t and later).

    Why chiptrace refuses to record there: the hot path appends a row to the recorder's
    current chunk without a lock (`cur = rec.cur; cur.append(row)`, chiptrace.recording.wrappers), and
    a thread that fills a chunk swaps in a new list and freezes the old one into a tuple
    (Recorder.roll). With the GIL no other thread runs between another thread's read of
    `rec.cur` and its append (the interpreter hands the GIL over only where it checks its
    eval breaker: function entry, backward jumps and after a call returns, never between
    loading `rec.cur` and the append), so no row lands in a frozen chunk. Without
    the GIL one could, and be lost. A lock per span would cost ~0.1 us of the ~0.8 us
    budget; per-thread chunks are the way to lift this (a later change).
    """
    probe = getattr(sys, "_is_gil_enabled", None)
    return True if probe is None else bool(probe())


def _build_recorder(
    cfg: _config.Config,
    exporters: Iterable[Any],
    sinks: Iterable[SpanSink],
    manifest: Mapping[str, Any] | None,
    deferred: bool = False,
) -> Recorder:
    facts = {"run_id": cfg.run_id, "service": cfg.service, "source": "code", **(manifest or {})}
    others = _other_sinks(cfg, exporters, sinks)

    def store() -> tuple[list[SpanSink], Any]:
        from chiptrace.store import PartWriter  # pyarrow: only where the store is made

        writer = PartWriter(cfg.dir, manifest=facts)
        return [StoreSink(writer)], writer

    if deferred:
        rec = Recorder(cfg, others, setup=store)
    else:
        first, writer = store()
        rec = Recorder(cfg, [*first, *others], writer)
    on_exit(rec.shutdown, takes_timeout=True)
    # multiprocessing children leave through os._exit, skipping atexit; its finalizers run.
    # Such a child has multiprocessing loaded already; others need not pay its import (5 ms).
    mp_util = sys.modules.get("multiprocessing.util")
    if mp_util is not None:
        _finalizers[id(rec)] = mp_util.Finalize(rec, rec.shutdown, exitpriority=100)
    return rec


def _other_sinks(
    cfg: _config.Config, exporters: Iterable[Any], sinks: Iterable[SpanSink]
) -> list[SpanSink]:
    """Every sink but the store, each on its own bounded queue and thread (_sinkqueue): a
    slow or hung exporter never holds up the store, the program or its exit."""
    from chiptrace.recording.sink_queue import QueuedSink

    out: list[Any] = list(sinks)
    exporters = list(exporters)
    if exporters or cfg.otlp_endpoint:
        from chiptrace.recording.otel_sinks import (
            ExporterSink,
            sdk_otlp_sink,
        )  # the OTel SDK: only when asked

        out += [ExporterSink(e, cfg) for e in exporters]
        if cfg.otlp_endpoint:
            out.append((EXTENSIONS.otlp_sink or sdk_otlp_sink)(cfg))
    return [
        s
        if getattr(s, "queued", False)
        else QueuedSink(s, cfg.sink_queue_spans, cfg.export_timeout_s)
        for s in out
    ]


# The Finalize holds rec.shutdown, a strong reference: a replaced recorder must cancel it
# (and its exit hook), or every init() would keep one recorder alive until exit.
_finalizers: dict[int, Any] = {}


def _release(rec: Recorder) -> None:
    """Flush and stop a recorder, and drop every reference chiptrace kept to it. One that
    could not finish now (shutdown() from a signal handler during its flush) keeps its
    exit hook: exit then waits for it, within the shutdown timeout."""
    if rec.shutdown() or rec.gave_up:
        _forget(rec)


def _forget(rec: Recorder) -> None:
    cancel_exit(rec.shutdown)
    fin = _finalizers.pop(id(rec), None)
    if fin is not None:
        fin.cancel()


_auto_lock = threading.Lock()


def _after_fork_in_child() -> None:
    """A forked child must not flush its parent's buffer nor reuse its part names: drop
    the inherited recorder; the child's first span starts its own, same dir and run."""
    global _auto_lock
    _auto_lock = threading.Lock()
    _STATE.lock = threading.Lock()
    rec, _STATE.recorder = _STATE.recorder, None
    if rec is not None:
        rec.abandon()
        _forget(rec)
        _STATE.fork_config = rec.config


os.register_at_fork(after_in_child=_after_fork_in_child)


def _auto_init() -> Recorder | None:
    """The first traced call without init(): configure from the environment, once."""
    if not _STATE.enabled:
        return None
    with _auto_lock:
        if _STATE.recorder is not None:
            return _STATE.recorder
        try:
            cfg = _STATE.fork_config
            if cfg is not None:
                return _init(
                    cfg.dir,
                    service=cfg.service,
                    run_id=cfg.run_id,
                    resource=cfg.resource,
                    flush_interval_s=cfg.flush_interval_s,
                    flush_spans=cfg.flush_spans,
                    max_buffered=cfg.max_buffered,
                    deferred=True,
                )
            return _init(deferred=True)
        except Exception as e:  # noqa: BLE001 - tracing must not crash the traced program
            logging.getLogger("chiptrace").warning("chiptrace: tracing disabled: %s", e)
            _STATE.enabled = False
            return None


def _start_sampler(cfg: _config.Config, interval: float) -> Sampler:
    """The host sampler beside the recorder: same dir, run and host."""
    if EXTENSIONS.host_sampler is None:
        raise ConfigError("sample_host: no host sampler is registered (chiptrace.host)")
    sampler = EXTENSIONS.host_sampler(cfg, interval)
    on_exit(sampler.stop)
    # Child processes inherit the environment: they see a sampler already runs on this host.
    os.environ.setdefault(_config.ENV_SAMPLER_PID, str(os.getpid()))
    return sampler


def _stop_sampler() -> None:
    sampler, _STATE.sampler = _STATE.sampler, None
    if sampler is not None:
        sampler.stop()
        cancel_exit(sampler.stop)


def get_recorder() -> Recorder | None:
    """The process's recorder, if tracing has started."""
    return _STATE.recorder


def flush() -> int:
    """Write everything buffered now; returns the number of spans flushed."""
    rec = _STATE.recorder
    return rec.flush() if rec is not None else 0


def shutdown() -> None:
    """Flush and stop the recorder; a later traced call starts a new one."""
    with _STATE.lock:
        rec, _STATE.recorder = _STATE.recorder, None
    if rec is not None:
        _release(rec)
    _stop_sampler()


_STATE.auto_init = _auto_init
