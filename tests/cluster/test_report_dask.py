"""`chiptrace report --dask`: the JSON is the single-process report's, worker killed or not."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from chiptrace.importers import import_trace
from tests.cluster.conftest import chiptrace_argv, chiptrace_cmd
from tests.waiting import wait_until

pytestmark = pytest.mark.dask
pytest.importorskip("distributed", reason="Dask distributed: pip install -e '.[test,dask]'")


@pytest.fixture(scope="module")
def stores(rank_files: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("stores")
    import_trace(rank_files, tmp / "flat")
    import_trace(rank_files, tmp / "hive", partition_by="rank")
    return {"flat": tmp / "flat", "hive": tmp / "hive"}


@pytest.fixture(scope="module")
def single(stores: dict[str, Path]) -> dict[str, dict]:
    """The single-process report of each store."""
    out = {}
    for name, path in stores.items():
        r = chiptrace_cmd("report", str(path), "--json")
        assert r.returncode == 0, r.stderr
        out[name] = json.loads(r.stdout)
    return out


def _close(a, b, path: str = "") -> None:
    """Equal, numbers to 6 significant digits (the issue's bar; today they are identical)."""
    if isinstance(a, float) and isinstance(b, (int, float)):
        assert b == pytest.approx(a, rel=1e-6, abs=1e-12), path
    elif isinstance(a, dict):
        assert isinstance(b, dict) and list(a) == list(b), path
        for k in a:
            _close(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, list):
        assert isinstance(b, list) and len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _close(x, y, f"{path}[{i}]")
    else:
        assert a == b, path


@pytest.mark.parametrize("layout", ["hive", "flat"])
def test_report_on_cluster_equals_single_process(cluster, stores, single, layout):
    r = chiptrace_cmd("report", str(stores[layout]), "--json", "--dask", cluster.address)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    assert len(got["metrics"]["ranks"]) == 8 and got["findings"]
    _close(single[layout], got)


def test_worker_killed_mid_report_gives_the_same_report(cluster, stores, single):
    """SIGKILL a worker once it has a rank task: Dask reruns its tasks elsewhere."""
    from distributed import Client

    victim = cluster.workers[0]
    proc = subprocess.Popen(
        chiptrace_argv("report", str(stores["hive"]), "--json", "--dask", cluster.address),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    with Client(cluster.address, timeout=10) as c:
        info = c.scheduler_info(n_workers=-1)["workers"]
        addr = next(a for a, w in info.items() if w["name"] == cluster.names[victim.pid])

        def busy() -> bool:
            return any("chiptrace-" in str(k) for k in c.processing(workers=[addr]).get(addr, ()))

        wait_until(lambda: proc.poll() is not None or busy(), "a report task on the victim", 240)
        killed = proc.poll() is None
        if killed:
            cluster.kill_worker(victim)
    stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 0, stderr
    assert killed, "the report ended before the worker had a task"
    _close(single["hive"], json.loads(stdout))
