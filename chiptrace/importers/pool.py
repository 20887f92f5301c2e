"""Kineto blocks decoded and mapped in worker processes, while the main process reads on.

Decoding JSON into Python objects holds the GIL, so threads cannot share it; processes
can. The main process cuts the file into blocks of a few MiB and hands each to a worker,
which decodes it, maps it (kineto_map) and writes its static columns to a spill file in
the staging folder; what comes back is only the ~37 bytes a span of numbers the tree
builder needs (pickled NumPy arrays). Workers are forked (Linux only), when the process has
no other thread: a fork copies no thread, so a lock another thread held would stay locked
in the child; `spawn` would run the caller's unguarded script again in every worker. Small
imports map in place: the workers' start-up would cost more than they save.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import threading
from concurrent.futures import Future, ProcessPoolExecutor
from typing import Any

import msgspec

from chiptrace.importers import events as ev
from chiptrace.importers.kineto_map import Mapped, map_events
from chiptrace.importers.source import bad_events
from chiptrace.importers.writer import write_spill

# Below this many bytes of Trace Event files the workers' start-up costs more than it saves.
MIN_POOL_BYTES = 48 << 20
_DECODER = msgspec.json.Decoder(list[ev.Event], strict=False)  # as TraceEventStream


def worker_count(requested: int | None, total_bytes: int) -> int:
    """Worker processes for an import: `requested`, else one per idle CPU (at most 4) for a
    big one, and none when fewer than two CPUs are idle: a busy machine has no core to
    give them, and then their hand-over costs more than it saves (28 s against 23 s for a
    1 GB trace on two cores that other work kept busy). Off Linux, or beside other
    threads, always 0: the blocks map in the main process."""
    if not sys.platform.startswith("linux") or threading.active_count() > 1:
        return 0
    if requested is not None:
        return max(0, requested)
    if total_bytes < MIN_POOL_BYTES:
        return 0
    idle = len(os.sched_getaffinity(0)) - os.getloadavg()[0]
    return min(int(idle + 0.5), 4) if idle >= 1.5 else 0


def map_block(raw: bytes, link_type: str, spill: str, path: str) -> Mapped | None:
    """Decode and map one `[...]` block and write its static columns to `spill`; None when
    the block does not decode (it was cut inside an event: the caller cuts again).

    Raises:
        TraceFormatError: an event of the wrong shape.
    """
    try:
        events = _DECODER.decode(raw)
    except msgspec.ValidationError as e:
        raise bad_events(path, f"an event of the wrong shape ({e})") from None
    except msgspec.DecodeError:
        return None
    mapped = map_events(events, link_type)
    if mapped.static.num_rows:
        write_spill(spill, mapped.static)
    mapped.static = None  # staged
    return mapped


class Pool:
    """Worker processes for map_block, forked on the first block (before the main process
    holds the numbers of many blocks, which the workers would share but not need)."""

    def __init__(self, workers: int) -> None:
        self.workers = workers
        self.depth = 2 * workers  # blocks out at once: each worker has the next one queued
        self._executor: ProcessPoolExecutor | None = None

    def submit(self, *args: Any) -> Future[Mapped | None]:
        if self._executor is None:
            self._executor = ProcessPoolExecutor(
                self.workers, mp_context=multiprocessing.get_context("fork")
            )
        return self._executor.submit(map_block, *args)

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=True, cancel_futures=True)
            self._executor = None
