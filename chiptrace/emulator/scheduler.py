"""Placement of heterogeneous work: a static round robin, or dynamic earliest-finish-time.

Static homes (which DPU feeds a GPU, which CPU hosts it, which NIC receives for it) go to
the nearest candidate; where several are equally near, `balanced` deals them round robin,
so a symmetric rack spreads its GPUs over its DPUs instead of piling them on the first.

`static` deals tasks to devices in turn, blind to how fast each device is or how busy it
already is: slow devices grow queues while fast ones idle. `dynamic` gives each task to the
device on which it would finish first, given what that device already has queued (list
scheduling, HEFT-style without the graph): fast devices take more, every device stays busy.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

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


def balanced(
    users: Sequence[str], nearest: Callable[[str], Sequence[str]], fallback: str
) -> dict[str, str]:
    """Each user's home: of its equally nearest candidates (`nearest(user)`, in order),
    the one given to the fewest users so far; `fallback` where it has none."""
    load: dict[str, int] = {}
    out = {}
    for u in users:
        options = list(nearest(u)) or [fallback]
        pick = min(options, key=lambda c: (load.get(c, 0), options.index(c)))
        load[pick] = load.get(pick, 0) + 1
        out[u] = pick
    return out
