"""Placement of heterogeneous work: a static round robin, or dynamic earliest-finish-time.

`static` deals tasks to devices in turn, blind to how fast each device is or how busy it
already is: slow devices grow queues while fast ones idle. `dynamic` gives each task to the
device on which it would finish first, given what that device already has queued (list
scheduling, HEFT-style without the graph): fast devices take more, every device stays busy.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

SCHEDULES = ("static", "dynamic")


def assign(
    tasks: Sequence[str],
    devices: Sequence[str],
    duration: Mapping[str, float],
    free: Mapping[str, float],
    policy: str,
) -> dict[str, str]:
    """Map each task to a device.

    Args:
        tasks: task names, in arrival order.
        devices: candidate devices.
        duration: how long one task takes on each device (ns).
        free: when each device can start its next task (ns).
        policy: `static` or `dynamic`.
    """
    if policy == "static":
        return {t: devices[i % len(devices)] for i, t in enumerate(tasks)}
    ready = dict(free)
    out = {}
    for t in tasks:
        d = min(devices, key=lambda x: (ready[x] + duration[x], x))
        out[t] = d
        ready[d] += duration[d]
    return out
