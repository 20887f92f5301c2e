"""`chiptrace.torch.profile()`: the PyTorch profiler, its traces imported into the run's store.

Each trace the profiler finishes (at the end of the block, or at the end of each cycle of a
`schedule`) is exported by PyTorch to a hidden Kineto JSON file in the trace dir, then
imported with chiptrace's Kineto importer into the same store as the program's spans, each
event under the chiptrace span that was open when it ran (chiptrace.importers.within), and
the file removed (kept only where `keep_traces` names a folder). The import runs in a
separate process (chiptrace.importers.background): the program pays for PyTorch's export
and nothing more; `wait()`, `chiptrace.shutdown()` or the process's exit wait for it.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch

from chiptrace.recording.spans import _STATE
from chiptrace.torch._window import RunSpans

log = logging.getLogger("chiptrace")

_active_profile: profile | None = None
_counter = itertools.count()


def _wait_at_shutdown(final: bool) -> None:
    """A recorder resolver: its shutdown waits for the traces being imported."""
    if final:
        from chiptrace.importers.background import EXIT_WAIT_S, importer

        if not importer().wait(EXIT_WAIT_S):
            log.warning("chiptrace: profiler traces still importing at shutdown")


def default_activities() -> list[torch.profiler.ProfilerActivity]:
    """CPU, and CUDA where PyTorch sees a CUDA device."""
    acts = [torch.profiler.ProfilerActivity.CPU]
    if torch.cuda.is_available():
        acts.append(torch.profiler.ProfilerActivity.CUDA)
    return acts


class profile:  # noqa: N801 - used like torch.profiler.profile
    """Profile a block with the PyTorch profiler; its traces join the run's store.

    `with chiptrace.torch.profile():` records the whole block (CPU, and CUDA where
    present). With `schedule=torch.profiler.schedule(...)`, call `prof.step()` once per
    iteration, as with torch.profiler: each cycle's trace is imported when it is ready.
    Other attributes (`key_averages()`, `step_num`, ...) are the torch profiler's.

    Args:
        schedule: a torch.profiler schedule; None records everything.
        activities: torch.profiler activities (default: CPU, plus CUDA where available).
        keep_traces: a folder to keep each Kineto JSON file in; by default none is left.
        on_trace_ready: also called with the torch profiler when a trace is ready.
        **kwargs: passed to torch.profiler.profile (record_shapes, with_stack, ...).
    """

    def __init__(
        self,
        *,
        schedule: Callable[[int], Any] | None = None,
        activities: Iterable[torch.profiler.ProfilerActivity] | None = None,
        keep_traces: str | os.PathLike[str] | None = None,
        on_trace_ready: Callable[[Any], None] | None = None,
        **kwargs: Any,
    ) -> None:
        self.schedule = schedule
        self.activities = list(activities) if activities is not None else default_activities()
        self.keep_traces = Path(keep_traces) if keep_traces is not None else None
        self.on_trace_ready = on_trace_ready
        self.kwargs = kwargs
        self.profiler: torch.profiler.profile | None = None
        self.traces_imported = 0
        self.traces_failed = 0
        self.spans_imported = 0
        self._spans: RunSpans | None = None
        self._since_ns = 0
        self._outer: profile | None = None
        self.stepped_by_program = False  # step() was called (not only chiptrace's own)

    # ------------------------------------------------------------ context manager

    def __enter__(self) -> profile:
        global _active_profile
        if _active_profile is not None:  # a profile inside one: the outer one records
            self._outer = _active_profile
            log.info("chiptrace.torch.profile(): already profiling; the outer profile records")
            return self
        rec = _STATE.recorder or _STATE.auto_init()
        if rec is None:  # tracing is off: no profiler either
            return self
        if self.keep_traces is not None:
            self.keep_traces.mkdir(parents=True, exist_ok=True)
        self._spans = RunSpans(rec)
        self._spans.note_open()
        from chiptrace.importers.background import importer

        importer().start()  # ~0.5 s, in the child, while the block runs
        if _wait_at_shutdown not in rec.resolvers:
            rec.resolvers = [*rec.resolvers, _wait_at_shutdown]
        self._since_ns = time.time_ns()
        self.profiler = torch.profiler.profile(
            activities=self.activities,
            schedule=self.schedule,
            on_trace_ready=self._ready,
            **self.kwargs,
        )
        try:
            self.profiler.__enter__()
        except BaseException:
            self._spans.close()
            self._spans = None
            raise
        _active_profile = self
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        global _active_profile
        if self.profiler is None:
            return
        try:
            self.profiler.__exit__(exc_type, exc, tb)  # imports the last trace
        finally:
            _active_profile = None
            if self._spans is not None:
                self._spans.close()

    def step(self) -> None:
        """Mark the end of an iteration (advances the schedule, as torch.profiler's)."""
        self._step(by_program=True)

    def _step(self, by_program: bool) -> None:
        target = self._outer or self  # a profile inside another steps the outer one
        target.stepped_by_program |= by_program
        if target.profiler is not None:
            target.profiler.step()

    def __getattr__(self, name: str) -> Any:
        owner = self.__dict__.get("_outer") or self
        prof = owner.__dict__.get("profiler")
        if prof is None:
            raise AttributeError(f"chiptrace.torch.profile has no {name!r} (not profiling)")
        return getattr(prof, name)

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until the traces handed over so far are in the store (or failed); False
        on timeout. Process exit and `chiptrace.shutdown()` wait too."""
        from chiptrace.importers.background import importer

        return importer().wait(timeout)

    # ------------------------------------------------------------ traces

    def _ready(self, prof: Any) -> None:
        """A trace is ready: export it, hand it to the background importer."""
        spans, rec = self._spans, _STATE.recorder
        try:
            if spans is not None and rec is not None:
                self._hand_over(prof, spans, Path(rec.config.dir))
        finally:
            self._since_ns = time.time_ns()
            if self.on_trace_ready is not None:
                self.on_trace_ready(prof)

    def _hand_over(self, prof: Any, spans: RunSpans, out: Path) -> None:
        from chiptrace.importers.background import importer

        n = next(_counter)
        if self.keep_traces is not None:
            path = self.keep_traces / f"{os.getpid()}.{n}.pt.trace.json"
        else:
            path = out / f".torch-{os.getpid()}-{n}.json"
        try:
            # The store's folder is made lazily, at the recorder's first flush (a light
            # start): the profiler's file may come first.
            path.parent.mkdir(parents=True, exist_ok=True)
            prof.export_chrome_trace(str(path))
        except Exception as e:  # noqa: BLE001 - the traced program goes on; counted
            with contextlib.suppress(OSError):
                path.unlink(missing_ok=True)
            self._done({"error": f"export failed: {e}"})
            return
        spans.note_open()  # the spans open on this thread now enclose the whole window
        since = self._since_ns
        spans.expect()
        importer().submit(
            path,
            out,
            prepare=lambda: spans.within(since),
            done=self._done,
            keep=self.keep_traces is not None,
        )

    def _done(self, result: dict[str, Any]) -> None:
        """A trace's import ended (on the importer's thread): count it."""
        if "error" in result:
            self.traces_failed += 1
            log.warning("chiptrace.torch: profiler trace not imported: %s", result["error"])
        else:
            self.traces_imported += 1
            self.spans_imported += result.get("spans", 0)
