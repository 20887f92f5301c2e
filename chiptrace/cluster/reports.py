"""The report's stages (chiptrace.analysis.stages) as Dask tasks: a `Runner` on a cluster."""

from __future__ import annotations

import secrets
from collections.abc import Callable, Sequence
from typing import Any

from chiptrace.cluster.client import Cluster


class DaskRunner:
    """Runs each stage call as a task and hands the results back in call order.

    A task killed with its worker is run again by Dask; a stage only reads, so the rerun
    gives what the first try would have. `progress(done, total)` is called as tasks end.
    """

    remote = True

    def __init__(
        self, cluster: Cluster, progress: Callable[[int, int], None] | None = None
    ) -> None:
        self.cluster = cluster
        self.parallelism = max(cluster.workers, 1)
        self.progress = progress
        self.done = 0
        self.total = 0
        self._token = secrets.token_hex(4)

    def map(self, name: str, fn: Callable[..., Any], calls: Sequence[tuple[Any, ...]]) -> list[Any]:
        base = f"chiptrace-{name}-{self._token}-{self.total}"
        futures = [self.cluster.submit(f"{base}-{i}", fn, *args) for i, args in enumerate(calls)]
        self.total += len(futures)
        index = {f.key: i for i, f in enumerate(futures)}
        out: list[Any] = [None] * len(futures)
        try:
            for fut in self.cluster.as_completed(futures):
                out[index[fut.key]] = fut.result()
                self.done += 1
                if self.progress:
                    self.progress(self.done, self.total)
        except BaseException:
            self.cluster.cancel(futures)
            raise
        return out
