"""The CUDA device timer behind `device_time=True` (the extension point is chiptrace.recording.device).

Around a call: a timing CUDA event recorded on the current stream before it and one after
(`cudaEventRecord`, a few microseconds of host time each; events are pooled per device).
The span is held until the second event has completed. The writer thread asks each held
span's end event (`query()`, which never blocks) and, for those done, places them on the
host clock: it records a reference event on a stream of its own, waits for that one event
(on the writer thread, so the program never waits), and takes the host time halfway
through the wait as the reference's device time; a span's device start is then that time
minus the device time from the span's start event to the reference (`elapsed_time`, ~0.5
us resolution). Only at shutdown does it wait for spans still running on the device.
"""

from __future__ import annotations

import collections
import logging
import time
from typing import Any

import torch

from chiptrace.recorder import Recorder
from chiptrace.recording import device as _device
from chiptrace.recording.spans import Span

log = logging.getLogger("chiptrace")

MAX_HELD = 100_000  # held spans beyond this are recorded without device time, and counted


def provider() -> CudaTimer | None:
    """The timer where CUDA is available, else None."""
    return CudaTimer() if torch.cuda.is_available() else None


class CudaTimer:
    """CUDA events around calls, resolved on the writer thread (see the module docstring)."""

    def __init__(self) -> None:
        self._free: dict[int, list[torch.cuda.Event]] = collections.defaultdict(list)
        self._held: collections.deque[tuple[Span, Any, Recorder | None]] = collections.deque()
        self._streams: dict[int, torch.cuda.Stream] = {}
        self.untimed = 0  # spans recorded without device time (too many held, or an error)

    # ------------------------------------------------------------ the program's thread

    def _event(self, device: int) -> torch.cuda.Event:
        free = self._free[device]
        return free.pop() if free else torch.cuda.Event(enable_timing=True)

    def start(self) -> Any:
        if len(self._held) >= MAX_HELD:  # the device is far behind: time the host only
            self.untimed += 1
            return None
        device = torch.cuda.current_device()
        ev = self._event(device)
        ev.record()
        return device, ev

    def stop(self, token: Any) -> Any:
        device, begin = token
        end = self._event(device)
        end.record()
        return device, begin, end

    def hold(self, span: Span, token: Any) -> None:
        self._held.append((span, token, _device.attach(self.resolve)))

    # ------------------------------------------------------------ the writer thread

    def _reference(self, device: int) -> tuple[torch.cuda.Event, int]:
        """A reference event on the device and its host time (see the module docstring)."""
        stream = self._streams.get(device)
        if stream is None:
            stream = self._streams[device] = torch.cuda.Stream(device)
        ref = self._event(device)
        t0 = time.time_ns()
        ref.record(stream)
        ref.synchronize()
        t1 = time.time_ns()
        return ref, t0 + (t1 - t0) // 2

    def resolve(self, final: bool) -> None:
        ready: list[tuple[Span, Any, Recorder | None]] = []
        for _ in range(len(self._held)):
            item = self._held.popleft()
            end = item[1][2]
            if final:
                end.synchronize()  # shutdown: the only wait, and not the program's
            elif not end.query():
                self._held.append(item)
                continue
            ready.append(item)
        if not ready:
            return
        refs: dict[int, tuple[torch.cuda.Event, int]] = {}
        for span, (device, begin, end), rec in ready:
            if device not in refs:
                refs[device] = self._reference(device)
            ref, host = refs[device]
            try:
                start = host - round(begin.elapsed_time(ref) * 1e6)
                stop = host - round(end.elapsed_time(ref) * 1e6)
            except RuntimeError as e:  # an event the device could not time: no device time
                self.untimed += 1
                log.debug("chiptrace: device time of %r lost: %s", span.name, e)
                _device.release(span, rec)
            else:
                _device.release(span, rec, (start, max(stop, start)), **{"device.index": device})
            self._free[device] += [begin, end]
        for device, (ref, _) in refs.items():
            self._free[device].append(ref)
