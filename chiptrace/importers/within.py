"""Importing into a recorded run: imported events nest under the run's own spans.

A trace taken beside a traced program (a PyTorch profiler trace from inside a process that
also records chiptrace spans, as `chiptrace.torch.profile()` does) shares its clock with
those spans. Given them, the import hangs each imported event under the innermost of them
that encloses it in time, when that span is nested deeper than the event's own parent in
the file, and gives the event (and everything under it) that span's trace id:

- host work: the innermost run span enclosing the event, if it started after the event's
  parent in the file started (a `ProfilerStep#N` that began before a `step` span of the
  program's yields to that span; an `aten::addmm` inside an `aten::linear` keeps its parent);
- device work at the top of its stream: the run span that enclosed the runtime call that
  launched it (the kernel often runs after that span has ended), under the same rule.

Run spans carry no thread, so when two threads have run spans open at once an event goes
under the one that started last. The imported spans take the run's service, host and
resource (the file's rank facts kept), and chip ids are not qualified by rank: the run's
own spans name this process's chips the same way.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from chiptrace.importers import tree
from chiptrace.importers.plan import ROLE_DEVICE, ROLE_STEP

OPEN_NS = np.iinfo(np.int64).max  # the end of a run span still open at import


@dataclass
class Within:
    """The run an import goes into.

    Args:
        trace_id: (n, 16) uint8, the trace id of each run span.
        span_id: n uint64.
        start, end: int64 Unix ns; `OPEN_NS` for a span still open.
        service, host, resource: the identity the imported spans take.
        run_id: the run id written in the import's manifest.
        manifest: more facts for the import's manifest.
    """

    trace_id: np.ndarray
    span_id: np.ndarray
    start: np.ndarray
    end: np.ndarray
    service: str
    host: str
    resource: dict[str, Any] = field(default_factory=dict)
    run_id: str = ""
    manifest: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._up = tree.nest(self.start, self.end, np.zeros(len(self.start), np.int32))
        self._order = np.argsort(self.start, kind="stable")

    _ARRAYS = ("trace_id", "span_id", "start", "end")
    _FACTS = ("service", "host", "resource", "run_id", "manifest")

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write to an uncompressed .npz (handed to an import in another process)."""
        facts = json.dumps({k: getattr(self, k) for k in self._FACTS})
        with open(path, "wb") as fh:
            np.savez(fh, facts=np.array(facts), **{k: getattr(self, k) for k in self._ARRAYS})

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Within:
        with np.load(path, allow_pickle=False) as z:
            arrays = {k: z[k] for k in cls._ARRAYS}
            facts = json.loads(str(z["facts"]))
        return cls(**arrays, **facts)

    def identity(self, file_resource: dict[str, Any]) -> tuple[dict[str, Any], str]:
        """(resource, host) of the imported spans: the run's, with the file's rank facts."""
        kept = {k: v for k, v in file_resource.items() if k.startswith(("distributed.", "nccl."))}
        return {**self.resource, **kept, "service.name": self.service}, self.host

    def enclosing(self, start: np.ndarray, end: np.ndarray) -> np.ndarray:
        """The innermost run span holding [start, end] of each row (index), or -1.

        The latest-starting span that starts by the row's start, then up its chain of
        enclosing spans until one ends no earlier than the row: the first that does is
        the latest-starting of all that hold the row (the chain skips only spans that end
        before one already too short).
        """
        out = np.full(len(start), -1, np.int64)
        if not len(self.start) or not len(start):
            return out
        k = np.searchsorted(self.start[self._order], start, side="right") - 1
        at = np.where(k >= 0, self._order[np.maximum(k, 0)], -1)
        active = np.flatnonzero(at >= 0)
        while len(active):
            short = self.end[at[active]] < end[active]
            done = active[~short]
            out[done] = at[done]
            active = active[short]
            at[active] = self._up[at[active]]
            active = active[at[active] >= 0]
        return out

    def adopt(
        self, start: np.ndarray, end: np.ndarray, role: np.ndarray, t: tree.Tree
    ) -> np.ndarray:
        """Hang rows under run spans (see the module docstring): the run span index each
        row now has as its parent, or -1; `t.parent` is -1 for those rows.

        Args:
            start, end: the rows' times in Unix ns (the file's offset applied).
            role: each row's ROLE_*.
            t: the file's tree; its `parent` is updated in place.
        """
        if not len(self.span_id):
            return np.full(len(start), -1, np.int64)
        holder = self.enclosing(start, end)
        device = role == ROLE_DEVICE
        parent = t.parent
        own = np.maximum(parent, 0)
        # Device work at the top of its stream (a root, or adopted by its profiler step)
        # takes the run span of the call that launched it.
        top = device & ((parent < 0) | (role[own] == ROLE_STEP))
        launch = t.launch_row
        via = top & (launch >= 0)
        holder[device & ~via] = -1
        holder[via] = holder[launch[via]]
        deeper = (holder >= 0) & ((parent < 0) | (self.start[np.maximum(holder, 0)] > start[own]))
        adopted = np.where(deeper, holder, -1)
        parent[deeper] = -1
        return adopted
