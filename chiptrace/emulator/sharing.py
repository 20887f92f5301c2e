"""Bandwidth shared max-min fairly: progressive filling, and the fluid model built on it.

A flow crosses link directions (ids into a capacity array, -1 pads a shorter route) and may
carry a ceiling of its own (what its sender can drive: a collective's kernels reach only a
fraction of a link, see efficiency.py). Progressive filling raises every unfrozen flow's
rate together until a direction fills or a flow hits its ceiling, freezes the flows that
stopped, and repeats: the result is the max-min fair allocation, which is work-conserving
(a flow held back elsewhere leaves the rest of a link to the others). The fluid model
re-runs it at every arrival and completion.

Cost: one pass per distinct bottleneck level (1 when every flow is alike, as in a ring
step), each a bincount over the flows' hops; the fluid model adds one fill per event.
"""

from __future__ import annotations

import numpy as np

_TIE = 1e-12  # relative: levels this close are the same bottleneck


def maxmin_rates(
    dirs: np.ndarray, capacity: np.ndarray, ceiling: np.ndarray | None = None
) -> np.ndarray:
    """Max-min fair rates (bytes/s) of flows over link directions.

    Args:
        dirs: (flows, hops) direction ids into `capacity`; -1 pads.
        capacity: bytes/s per direction.
        ceiling: per-flow maximum rate (bytes/s), or None for none.

    Returns:
        Rate per flow; inf for a flow that crosses no direction and has no ceiling.
    """
    n = dirs.shape[0]
    valid = dirs >= 0
    safe = np.where(valid, dirs, 0)
    top = np.full(n, np.inf) if ceiling is None else np.asarray(ceiling, dtype=np.float64)
    rate = np.zeros(n)
    live = valid.any(axis=1) | np.isfinite(top)
    rate[~live] = np.inf
    residual = np.asarray(capacity, dtype=np.float64).copy()
    while live.any():
        counts = np.bincount(safe[live][valid[live]], minlength=len(residual))
        used = counts > 0
        level = np.full(len(residual), np.inf)
        level[used] = residual[used] / counts[used]
        headroom = top[live] - rate[live]
        inc = min(float(level.min()), float(headroom.min()))
        rate[live] += inc
        residual[used] -= inc * counts[used]
        full = used & (level <= inc * (1 + _TIE))
        capped = np.isfinite(top) & (top - rate <= top * _TIE)
        stopped = (full[safe] & valid).any(axis=1) | capped
        live &= ~stopped
    return rate


def fluid_ends(
    dirs: np.ndarray,
    nbytes: np.ndarray,
    ready: np.ndarray,
    capacity: np.ndarray,
    ceiling: np.ndarray | None = None,
) -> np.ndarray:
    """End times (ns) of transfers that start moving bytes at `ready` (ns, after their
    route latency), each at its max-min fair rate among the transfers moving at the time;
    rates are recomputed at every arrival and completion.

    Args:
        dirs: (flows, hops) direction ids; -1 pads.
        nbytes: bytes per flow.
        ready: when each flow's first byte can move (ns).
        capacity: bytes/s per direction.
        ceiling: per-flow maximum rate (bytes/s), or None.
    """
    n = len(nbytes)
    end = np.full(n, np.nan)
    if n == 0:
        return end
    ready = np.asarray(ready, dtype=np.float64)
    remaining = np.asarray(nbytes, dtype=np.float64).copy()
    order = np.argsort(ready, kind="stable")
    arrived = np.zeros(n, dtype=bool)
    t, k = float(ready[order[0]]), 0
    while True:
        while k < n and ready[order[k]] <= t:
            arrived[order[k]] = True
            k += 1
        idx = np.flatnonzero(arrived & np.isnan(end))
        if not len(idx):
            if k == n:
                return end
            t = float(ready[order[k]])
            continue
        rates = maxmin_rates(dirs[idx], capacity, None if ceiling is None else ceiling[idx])
        with np.errstate(divide="ignore", invalid="ignore"):
            finish = np.where(remaining[idx] > 0, remaining[idx] / rates * 1e9, 0.0)
        step = float(finish.min())
        if k < n:
            step = min(step, float(ready[order[k]]) - t)
        t += step
        done = finish <= step * (1 + _TIE) + 1e-9
        end[idx[done]] = t
        moving = idx[~done]
        remaining[moving] -= rates[~done] * step / 1e9
