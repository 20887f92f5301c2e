"""A big file's blocks decoded and mapped as tasks of their own: pool.Pool on the cluster.

The reading task (chiptrace.importers.tasks.read_file) reads and cuts its file as the
in-process import does with its process pool (chiptrace.importers.pool), and hands each
block to `submit`, which makes it a Dask task: decode, map, spill its columns into the
reading task's folder on the shared storage, send back the ~37 bytes a span the tree needs.
While it waits, the reading task gives its worker thread back (`worker_client` secedes), so
a cluster of one-thread workers cannot deadlock on readers waiting for their blocks.
"""

from __future__ import annotations

from typing import Any

from chiptrace.importers.pool import map_block


class BlockTasks:
    """pool.Pool's interface (`depth`, `submit`) on the cluster the task runs on."""

    def __init__(self, depth: int) -> None:
        self.depth = depth  # blocks out at once
        self._context: Any = None
        self._client: Any = None

    def __enter__(self) -> BlockTasks:
        from distributed import worker_client

        self._context = worker_client()
        self._client = self._context.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._context.__exit__(*exc)
        self._context = self._client = None

    def submit(self, *args: Any) -> Any:
        # A block task writes only its own spill file, whole: a retry rewrites it.
        return self._client.submit(map_block, *args, pure=False)
