"""Cross-event decisions for Trace Event files, in NumPy: parents, steps, trace ids, links.

- Parent: the innermost span on the same thread (device: the same stream) that encloses
  the span. Found as the "previous greater-or-equal end" in (thread, start, -end) order
  by pointer jumping: each span keeps a pointer to an earlier candidate and, while the
  candidate ends too early, jumps to the candidate's own pointer. Every jump at least
  doubles the skipped distance, so it takes O(log n) vectorised rounds, not a Python loop.
- Step: `ProfilerStep#N` spans are roots. Another root takes the step whose window holds
  its start (as HolisticTraceAnalysis assigns iterations); a device root takes the step of
  the runtime call that launched it (same `correlation`), and becomes that step's child.
- Trace id: one per step number, shared by every rank, so a step's critical path and
  stragglers cross ranks; spans outside any step share one trace per file.
- Link: each device span links to the runtime call that launched it.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from chiptrace.importers import arrow
from chiptrace.importers.plan import ROLE_DEVICE, ROLE_LAUNCH, ROLE_STEP

_HEX = np.frombuffer(b"0123456789abcdef", np.uint8)


def splitmix64(x: np.ndarray) -> np.ndarray:
    """A bijection on uint64 that scatters sequential inputs: distinct in, distinct out."""
    with np.errstate(over="ignore"):
        z = x.astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def hex_digits(raw: np.ndarray) -> np.ndarray:
    """Lowercase hex text of an (n, w) uint8 matrix, as an (n, 2w) uint8 matrix."""
    out = np.empty((raw.shape[0], raw.shape[1] * 2), np.uint8)
    out[:, 0::2] = _HEX[raw >> 4]
    out[:, 1::2] = _HEX[raw & 15]
    return out


def trace_id(seed: bytes, *parts: object) -> bytes:
    return hashlib.blake2b(repr(parts).encode(), key=seed, digest_size=16).digest()


def nest(start: np.ndarray, end: np.ndarray, thread: np.ndarray) -> np.ndarray:
    """Index of each span's innermost enclosing span on the same thread, or -1."""
    n = len(start)
    if n == 0:
        return np.zeros(0, np.int64)
    order = nesting_order(start, end, thread)
    e, th = end[order], thread[order]
    jump = np.arange(-1, n - 1, dtype=np.int64)
    jump[np.r_[True, th[1:] != th[:-1]]] = -1
    active = np.nonzero(jump >= 0)[0]
    while len(active):
        j = jump[active]
        short = e[j] < e[active]  # the candidate ends before this span: not an ancestor
        active = active[short]
        jump[active] = jump[jump[active]]
        active = active[jump[active] >= 0]
    parent = np.full(n, -1, np.int64)
    has = jump >= 0
    parent[order[has]] = order[jump[has]]
    return parent


def nesting_order(start: np.ndarray, end: np.ndarray, thread: np.ndarray) -> np.ndarray:
    """The rows in (thread, start, -end) order. One int64 key (thread, start) sorts 3-4x
    faster than a three-key lexsort; only rows that tie on it are sorted again by -end."""
    span = int(start.max()) - int(start.min())
    if span >= 1 << 50 or int(thread.max()) >= 1 << 12 or int(thread.min()) < 0:
        return np.lexsort((-end, start, thread))
    key = (thread.astype(np.int64) << 50) | (start - start.min())
    order = np.argsort(key)
    k = key[order]
    tie = np.zeros(len(k), bool)
    tie[1:] = k[1:] == k[:-1]
    tie[:-1] |= tie[1:]
    if tie.any():
        at = np.flatnonzero(tie)  # runs of equal keys, each in one piece
        rows = order[at]
        order[at] = rows[np.lexsort((rows, -end[rows], key[rows]))]  # as a stable lexsort
    return order


def roots_of(parent: np.ndarray) -> np.ndarray:
    """The top ancestor of every span (itself for a root), by pointer doubling."""
    root = np.where(parent >= 0, parent, np.arange(len(parent)))
    while True:
        nxt = root[root]
        if np.array_equal(nxt, root):
            return root
        root = nxt


@dataclass
class Tree:
    parent: np.ndarray  # row index or -1
    step_row: np.ndarray  # row of the step span each span belongs to, or -1
    launch_row: np.ndarray  # for device spans: the launching call's row, or -1


def build(
    start: np.ndarray, end: np.ndarray, thread: np.ndarray, role: np.ndarray, corr: np.ndarray
) -> Tree:
    """Parents, steps and launches of one file's spans (see the module docstring)."""
    n = len(start)
    parent = nest(start, end, thread)
    is_step = role == ROLE_STEP
    parent[is_step] = -1
    launch_row = _launches(role, corr)
    # Windows of the steps, by start: a root takes the step its start falls in.
    steps = np.nonzero(is_step)[0]
    steps = steps[np.argsort(start[steps], kind="stable")]
    s0, s1 = start[steps], end[steps]

    def window(rows: np.ndarray) -> np.ndarray:
        k = np.searchsorted(s0, start[rows], side="right") - 1
        inside = (k >= 0) & (start[rows] < s1[np.maximum(k, 0)])
        return np.where(inside, steps[np.maximum(k, 0)], -1)

    root = roots_of(parent)
    step_of_root = np.full(n, -1, np.int64)
    step_of_root[steps] = steps
    roots = np.nonzero((parent < 0) & ~is_step)[0]
    host_roots = roots[role[roots] != ROLE_DEVICE]
    if len(steps):
        step_of_root[host_roots] = window(host_roots)
    dev_roots = roots[role[roots] == ROLE_DEVICE]
    if len(dev_roots):
        via = launch_row[dev_roots]
        by_launch = np.where(via >= 0, step_of_root[root[np.maximum(via, 0)]], -1)
        by_time = window(dev_roots) if len(steps) else np.full(len(dev_roots), -1)
        step_of_root[dev_roots] = np.where(via >= 0, by_launch, by_time)
    step_row = step_of_root[root]
    # Roots inside a step hang under it, so a step's tree holds all of its work.
    adopt = roots[step_of_root[roots] >= 0]
    parent[adopt] = step_of_root[adopt]
    return Tree(parent, step_row, launch_row)


def _launches(role: np.ndarray, corr: np.ndarray) -> np.ndarray:
    out = np.full(len(role), -1, np.int64)
    launch = np.nonzero((role == ROLE_LAUNCH) & (corr >= 0))[0]
    dev = np.nonzero((role == ROLE_DEVICE) & (corr >= 0))[0]
    if not len(launch) or not len(dev):
        return out
    launch = launch[np.argsort(corr[launch], kind="stable")]
    keys = corr[launch]
    k = np.minimum(np.searchsorted(keys, corr[dev]), len(keys) - 1)
    hit = keys[k] == corr[dev]
    out[dev[hit]] = launch[k[hit]]
    return out


def link_column(
    has: np.ndarray, trace_ids: np.ndarray, span_ids: np.ndarray, kind: str = "launch"
) -> pa.Array:
    """The links JSON of each row: where `has`, one link to the next (trace id, span id) of
    `trace_ids` ((m, 16) uint8) and `span_ids` (m uint64), else null. Every link has the
    same length, so the text is one NumPy matrix: a template row with the ids' hex in it."""
    head, mid = b'[{"trace_id":"', b'","span_id":"'
    template = (
        head + b"0" * 32 + mid + b"0" * 16 + f'","attributes":{{"kind":"{kind}"}}}}]'.encode()
    )
    rows = np.tile(np.frombuffer(template, np.uint8), (len(span_ids), 1))
    t0 = len(head)
    s0 = t0 + 32 + len(mid)
    rows[:, t0 : t0 + 32] = hex_digits(trace_ids)
    rows[:, s0 : s0 + 16] = hex_digits(span_ids.astype(">u8").view(np.uint8).reshape(-1, 8))
    lengths = np.where(has, len(template), 0).astype(np.int32)
    text = arrow.binary_from(rows.tobytes(), lengths, pa.string())
    return pa.Array.from_buffers(pa.string(), len(has), [arrow.bitmap(has), *text.buffers()[1:]])
