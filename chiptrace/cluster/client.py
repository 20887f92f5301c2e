"""A Dask client for import and report: connect, check the workers, run tasks.

Everything that can go wrong before a task runs is found here, with one line each: a
scheduler that does not answer (its address and the time waited), workers whose versions
differ from the client's (Dask's own message), a worker that cannot see the trace dir (its
address and the path). Nothing is written to the trace dir before these checks pass.
"""

from __future__ import annotations

import logging
import os
import secrets
import sys
import time
import warnings
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from chiptrace.config import ENV_DASK_SCHEDULER
from chiptrace.errors import ChiptraceError

CONNECT_TIMEOUT_S = 10.0  # how long to wait for a scheduler before giving up
LOCAL = "local"
CANCEL_WAIT_S = 60.0  # how long a failed run waits for its cancelled tasks to stop
_BUSY = ("executing", "long-running", "cancelled", "resumed")


class ClusterError(ChiptraceError):
    """The Dask cluster cannot be reached or used (scheduler, workers, shared storage)."""


def address_from(arg: str | None) -> str | None:
    """`--dask ADDRESS`, else CHIPTRACE_DASK_SCHEDULER, else None (no cluster)."""
    return arg or os.environ.get(ENV_DASK_SCHEDULER) or None


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


class Cluster:
    """A connected Dask client (and the LocalCluster it started, for `local`).

    Use as a context manager; `submit`/`as_completed` are the executor the import plan
    (chiptrace.importers.tasks) and the report stages (chiptrace.cluster.reports) run on.
    """

    def __init__(
        self, address: str, workers: int | None = None, timeout_s: float = CONNECT_TIMEOUT_S
    ) -> None:
        try:
            import distributed
        except ImportError:
            raise ClusterError(
                "--dask needs Dask distributed: pip install 'chiptrace[dask]'"
            ) from None
        self._distributed = distributed
        self.address = address
        self._local: Any = None
        self.client: Any = None
        if address != LOCAL:
            _check_address(distributed, address)
        elif workers is not None and workers < 1:
            raise ClusterError(f"--workers {workers}: a LocalCluster needs 1 or more")
        t0 = time.monotonic()
        try:
            if address == LOCAL:
                self._local = distributed.LocalCluster(
                    n_workers=workers if workers is not None else 2,
                    threads_per_worker=1,
                    host="127.0.0.1",
                    dashboard_address="127.0.0.1:0",
                    # A failed task is reported here, once, as the client's error line.
                    silence_logs=logging.CRITICAL,
                )
                target: Any = self._local
            else:
                target = address
            with warnings.catch_warnings():  # a version mismatch: said below, on one line
                warnings.simplefilter("ignore", distributed.versions.VersionMismatchWarning)
                self.client = distributed.Client(target, timeout=timeout_s, set_as_default=False)
        except (OSError, TimeoutError) as e:
            self.close()
            waited = time.monotonic() - t0
            raise ClusterError(
                f"cannot reach the Dask scheduler at {address} (waited {waited:.1f} s): "
                f"{_one_line(str(e))}"
            ) from None
        try:
            self.check_versions()
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self.client is not None:
            self.client.close()
            self.client = None
        if self._local is not None:
            self._local.close()
            self._local = None

    # ------------------------------------------------------------ checks

    def check_versions(self) -> None:
        """Dask's version check (client, scheduler, workers), chiptrace's version too. Dask
        only warns; here a mismatch stops the run: workers running other code than the
        client could store or report something else than it would."""
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                self.client.get_versions(check=True, packages=["chiptrace"])
            except ValueError as e:
                raise ClusterError(_one_line(str(e))) from None
        for w in caught:
            if "ismatch" in str(w.message):
                raise ClusterError(_one_line(str(w.message)))

    def check_paths(self, paths: Iterable[Path], store: Path | None = None) -> None:
        """Every worker sees each of `paths` and (to write into) the very folder `store`: a
        token the client writes there must read back. One line naming the first worker
        that does not, before any task runs."""
        token = secrets.token_hex(8)
        probe = None if store is None else store / f".dask-probe-{token}"
        if probe is not None:
            probe.write_text(token)
        try:
            seen = self.client.run(
                _can_see, [str(p) for p in paths], None if probe is None else str(probe), token
            )
        finally:
            if probe is not None:
                probe.unlink(missing_ok=True)
        if not seen:
            raise ClusterError(f"no Dask worker is connected to the scheduler at {self.address}")
        for worker, missing in sorted(seen.items()):
            if missing:
                raise ClusterError(
                    f"Dask worker {worker} cannot see {missing}; expected storage every "
                    "worker sees (the same path on every host)"
                )

    # ------------------------------------------------------------ tasks

    @property
    def workers(self) -> int:
        return len(self.client.scheduler_info(n_workers=-1).get("workers", {}))

    def dashboard(self) -> str | None:
        """The scheduler's dashboard address, or None where it runs without one."""
        info = self.client.scheduler_info(n_workers=0)
        if "dashboard" not in info.get("services", {}):
            return None
        link: str | None = self.client.dashboard_link
        return link

    def submit(self, key: str, fn: Callable[..., Any], *args: Any) -> Any:
        # pure=False with a key of our own: a retried task keeps its name in the dashboard.
        return self.client.submit(fn, *args, key=key, pure=False)

    def as_completed(self, futures: list[Any]) -> Iterator[Any]:
        return iter(self._distributed.as_completed(futures, loop=self.client.loop))

    def block_pool(self, size: int) -> Any:
        """Block tasks for a big file's reading task (two a worker out at once); None for
        a file under pool.MIN_POOL_BYTES: its task maps it faster than tasks would."""
        from chiptrace.cluster.blocks import BlockTasks
        from chiptrace.importers.pool import MIN_POOL_BYTES

        return BlockTasks(2 * max(self.workers, 1)) if size >= MIN_POOL_BYTES else None

    def cancel(self, futures: list[Any]) -> None:
        """Cancel the tasks and wait (at most CANCEL_WAIT_S) until none still runs: a task
        Dask cancels goes on running on its worker, and could write into a staging folder
        the client is about to remove."""
        keys = [f.key for f in futures]
        self.client.cancel(futures)
        deadline = time.monotonic() + CANCEL_WAIT_S
        try:
            while time.monotonic() < deadline:
                if not any(self.client.run(_running, keys, on_error="ignore").values()):
                    return
                time.sleep(0.05)
        except Exception:  # a client going down: nothing left to wait for
            return


def _running(keys: list[str], dask_worker: Any = None) -> bool:
    """Run on each worker: whether one of `keys` still executes there."""
    tasks = dask_worker.state.tasks
    return any(k in tasks and tasks[k].state in _BUSY for k in keys)


def _check_address(distributed: Any, address: str) -> None:
    try:
        _, location = distributed.comm.parse_address(address)
        distributed.comm.addressing.parse_host_port(location)
    except ValueError as e:
        raise ClusterError(
            f"--dask {address!r}: {_one_line(str(e))}; expected a scheduler address "
            f"(tcp://host:8786) or {LOCAL}"
        ) from None


def _can_see(paths: list[str], probe: str | None, token: str) -> str | None:
    """Run on each worker: the first path it cannot see, or None."""
    try:
        if probe is not None:
            with open(probe, encoding="utf-8") as fh:
                if fh.read() != token:
                    return str(Path(probe).parent)
    except OSError:
        return str(Path(probe).parent) if probe is not None else None
    for p in paths:
        if not os.path.exists(p):
            return p
    return None


def note(text: str) -> None:
    """A line for the user on stderr (the dashboard's address, a cluster's size)."""
    sys.stderr.write(text + "\n")
    sys.stderr.flush()
