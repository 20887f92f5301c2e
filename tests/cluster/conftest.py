"""A real Dask cluster on 127.0.0.1: `dask scheduler` and `dask worker` processes (Dask's own
commands), random free ports, dashboards on 127.0.0.1. Every test module here sets marker `dask` (its
own CI step: pip install -e '.[test,dask]' && pytest -m dask) and skips where Dask is missing.
Teardown kills every process it started."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))  # rank_files: many-rank traces from the fixtures

START_S = 60.0  # a loaded 2-core machine starts a scheduler and two workers in ~5 s


def dask_cmd(*args: str) -> list[str]:
    """Dask's own command (`dask scheduler`, `dask worker`), run by this interpreter."""
    return [sys.executable, "-m", "dask", *args]


@dataclass
class DaskCluster:
    """A scheduler and its workers, as processes this test session started."""

    tmp: Path
    address: str = ""
    scheduler: subprocess.Popen | None = None
    workers: list[subprocess.Popen] = field(default_factory=list)
    names: dict[int, str] = field(default_factory=dict)  # worker pid -> its --name
    _named: int = 0

    def start(self) -> None:
        sched_file = self.tmp / "scheduler.json"
        self.scheduler = self._spawn(
            dask_cmd(
                "scheduler",
                "--host",
                "127.0.0.1",
                "--port",
                "0",
                "--dashboard-address",  # its HTTP server runs even with --no-dashboard
                "127.0.0.1:0",
                "--scheduler-file",
                str(sched_file),
            ),
            "scheduler",
        )
        wait_until(sched_file.exists, "dask scheduler wrote its address", START_S)
        self.address = json.loads(sched_file.read_text())["address"]
        for _ in range(2):
            self.add_worker()
        self.wait_workers(2)

    def add_worker(self, *wrap: str, env: dict[str, str] | None = None) -> subprocess.Popen:
        """One more `dask worker` (no nanny: a SIGKILL ends it for good), one thread;
        `wrap` is a command line it runs under (unshare ... for a worker blind to a path),
        `env` variables it gets besides this process's."""
        self._named += 1
        cmd = dask_cmd(
            "worker",
            self.address,
            "--nthreads",
            "1",
            "--no-nanny",
            "--dashboard-address",
            "127.0.0.1:0",
            "--host",
            "127.0.0.1",
            "--name",
            f"w{self._named}",
        )
        proc = self._spawn([*wrap, *cmd], f"worker-{self._named}", env)
        self.names[proc.pid] = f"w{self._named}"
        self.workers.append(proc)
        return proc

    def _spawn(
        self, cmd: list[str], name: str, env: dict[str, str] | None = None
    ) -> subprocess.Popen:
        log = open(self.tmp / f"{name}.log", "wb")  # noqa: SIM115 - closed with the process
        return subprocess.Popen(
            cmd,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=self.tmp,
            env={**os.environ, **(env or {})},
        )

    def live_workers(self) -> int:
        from distributed import Client

        with Client(self.address, timeout=10) as c:
            return len(c.scheduler_info(n_workers=-1)["workers"])

    def wait_workers(self, n: int) -> None:
        wait_until(lambda: self.live_workers() >= n, f"{n} dask workers connected", START_S, 0.2)

    def kill_worker(self, proc: subprocess.Popen) -> None:
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        self.workers.remove(proc)

    def ensure_two(self) -> None:
        """Back to two live workers (after a test killed or added some)."""
        while len(self.workers) > 2:
            self.kill_worker(self.workers[-1])
        while len(self.workers) < 2:
            self.add_worker()
        wait_until(lambda: self.live_workers() == 2, "two dask workers", START_S, 0.2)

    def stop(self) -> None:
        for p in [*self.workers, self.scheduler]:
            if p is not None and p.poll() is None:
                p.send_signal(signal.SIGKILL)
                p.wait(10)
        self.workers.clear()


@pytest.fixture(scope="session")
def dask_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaskCluster]:
    c = DaskCluster(tmp_path_factory.mktemp("dask"))
    try:
        c.start()
        yield c
    finally:
        c.stop()


@pytest.fixture
def cluster(dask_cluster: DaskCluster) -> Iterator[DaskCluster]:
    """The session's cluster with two live workers, restored after the test."""
    dask_cluster.ensure_two()
    yield dask_cluster
    dask_cluster.ensure_two()


@pytest.fixture(scope="session")
def rank_files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Eight rank files (renumbered ranks, shifted clocks) made from the Kineto fixtures."""
    from rank_files import make_rank_files

    out = tmp_path_factory.mktemp("ranks")
    make_rank_files(out, 8, copies=2)
    return out


def chiptrace_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "chiptrace", *args]


def chiptrace_cmd(
    *args: str, env: dict[str, str] | None = None, **kw
) -> subprocess.CompletedProcess:
    """`chiptrace ...` as a fresh process, bounded in time."""
    return subprocess.run(
        chiptrace_argv(*args),
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **(env or {})},
        **kw,
    )
