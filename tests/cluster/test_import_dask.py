"""`chiptrace import --dask`: against a real scheduler and two workers (tests/cluster/conftest.py)."""

from __future__ import annotations

import shutil
import socket
import subprocess
from pathlib import Path

import pytest

import chiptrace
from chiptrace.importers import import_trace
from tests.cluster.conftest import chiptrace_argv, chiptrace_cmd
from tests.waiting import wait_until

pytestmark = pytest.mark.dask
pytest.importorskip("distributed", reason="Dask distributed: pip install -e '.[test,dask]'")

SPANS_SQL = "SELECT name, chip_id, start_ns, end_ns, op_kind, links IS NULL FROM spans ORDER BY ALL"


def spans_of(directory: Path) -> list[tuple]:
    con = chiptrace.connect(directory)
    n, distinct = con.execute("SELECT count(*), count(DISTINCT span_id) FROM spans").fetchone()
    assert n == distinct, f"{directory}: {n - distinct} span ids stored twice"
    return con.execute(SPANS_SQL).fetchall()


@pytest.fixture(scope="module")
def in_process(rank_files: Path, tmp_path_factory: pytest.TempPathFactory) -> list[tuple]:
    out = tmp_path_factory.mktemp("in-process")
    import_trace(rank_files, out)
    return spans_of(out)


def test_import_on_cluster_equals_in_process(cluster, rank_files, in_process, tmp_path):
    out = tmp_path / "run"
    r = chiptrace_cmd(
        "import",
        str(rank_files),
        "--out",
        str(out),
        env={"CHIPTRACE_DASK_SCHEDULER": cluster.address},
    )
    assert r.returncode == 0, r.stderr
    assert f"Dask: 2 workers at {cluster.address}, dashboard http://127.0.0.1:" in r.stderr
    assert spans_of(out) == in_process
    # Only the committed store is left: no staging folder, one manifest (the import's).
    assert sorted(p.name for p in out.iterdir()) == ["manifest", "spans"]
    assert len(list((out / "manifest").iterdir())) == 1


def test_partition_by_rank_writes_hive_folders(cluster, rank_files, in_process, tmp_path):
    out = tmp_path / "run"
    r = chiptrace_cmd(
        "import",
        str(rank_files),
        "--out",
        str(out),
        "--dask",
        cluster.address,
        "--partition-by",
        "rank",
    )
    assert r.returncode == 0, r.stderr
    folders = sorted(p.name for p in (out / "spans").iterdir())
    assert folders == [f"rank={k}" for k in range(8)]
    for k in range(8):  # each folder holds that rank's spans only
        con = chiptrace.connect(sorted((out / "spans" / f"rank={k}").glob("*.parquet")))
        chips = {c for (c,) in con.execute("SELECT DISTINCT chip_id FROM spans").fetchall() if c}
        assert chips and all(c.startswith(f"rank{k}/") for c in chips), chips
    assert spans_of(out) == in_process


def test_worker_killed_mid_import_loses_and_doubles_nothing(
    cluster, rank_files, in_process, tmp_path
):
    """SIGKILL a worker while both run a task: Dask reruns its task elsewhere, and the
    store ends with every span exactly once (the retried task replaced its own folder)."""
    out = tmp_path / "run"

    def running() -> int:  # task folders not yet renamed into place: tasks running now
        return len(list(out.glob(".import-*/*.tmp-*")))

    victim = cluster.workers[0]
    proc = subprocess.Popen(
        chiptrace_argv("import", str(rank_files), "--out", str(out), "--dask", cluster.address),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_until(lambda: running() >= 2, "two tasks running at once", 120, 0.005)
        cluster.kill_worker(victim)
        stdout, stderr = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, stderr
    assert spans_of(out) == in_process


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_unreachable_scheduler_is_one_line_and_writes_nothing(rank_files, tmp_path):
    address = f"tcp://127.0.0.1:{_free_port()}"
    out = tmp_path / "run"
    r = chiptrace_cmd("import", str(rank_files), "--out", str(out), "--dask", address)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert address in lines[0] and "waited" in lines[0] and "Traceback" not in r.stderr
    assert not out.exists()


def _unshare_works() -> bool:
    if shutil.which("unshare") is None:
        return False
    r = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "true"], capture_output=True
    )
    return r.returncode == 0


@pytest.mark.skipif(not _unshare_works(), reason="needs `unshare --mount` (root, Linux)")
def test_worker_that_cannot_see_the_store_is_named(cluster, rank_files, tmp_path):
    """A third worker in its own mount namespace with an empty tmpfs over the store's
    folder: the import stops before any task runs, naming that worker and the path."""
    store_parent = tmp_path / "shared"
    store_parent.mkdir()
    cluster.add_worker(
        "unshare",
        "--mount",
        "--propagation",
        "private",
        "sh",
        "-c",
        f'mount -t tmpfs none "{store_parent}" && exec "$0" "$@"',
    )
    cluster.wait_workers(3)
    out = store_parent / "run"
    r = chiptrace_cmd("import", str(rank_files), "--out", str(out), "--dask", cluster.address)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert "cannot see" in lines[0] and str(out) in lines[0]
    assert "127.0.0.1:" in lines[0]  # the worker's address
    assert not out.exists()  # made for the check, removed again


def test_worker_with_another_chiptrace_is_dasks_message_on_one_line(cluster, rank_files, tmp_path):
    """A worker whose environment holds another chiptrace (a stale install's metadata first
    on its path): Dask's version check names the package, on one line, before any task."""
    stale = tmp_path / "stale"
    meta = stale / "chiptrace-0.0.1.dist-info"
    meta.mkdir(parents=True)
    (meta / "METADATA").write_text("Metadata-Version: 2.1\nName: chiptrace\nVersion: 0.0.1\n")
    cluster.add_worker(env={"PYTHONPATH": str(stale)})
    cluster.wait_workers(3)
    out = tmp_path / "run"
    r = chiptrace_cmd("import", str(rank_files), "--out", str(out), "--dask", cluster.address)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert "chiptrace" in lines[0] and "0.0.1" in lines[0] and "ismatch" in lines[0]
    assert not out.exists()


def test_a_bad_file_fails_the_import_on_one_line_and_stores_nothing(cluster, rank_files, tmp_path):
    inputs = tmp_path / "in"
    inputs.mkdir()
    for f in sorted(rank_files.iterdir())[:3]:
        (inputs / f.name).symlink_to(f)
    (inputs / "zz-cut.json").write_text('{"traceEvents": [{"ph": "X", "name": 5')
    out = tmp_path / "run"
    r = chiptrace_cmd("import", str(inputs), "--out", str(out), "--dask", cluster.address)
    assert r.returncode == 2
    errors = [ln for ln in r.stderr.splitlines() if not ln.startswith("Dask: ")]
    assert len(errors) == 1 and "zz-cut.json" in errors[0], r.stderr
    assert not (out / "spans").exists() and not list(out.glob(".import-*"))


@pytest.mark.parametrize(
    "args, says",
    [
        (["--dask", "foo"], "--dask 'foo'"),
        (["--dask", "tcp://127.0.0.1"], "--dask 'tcp://127.0.0.1'"),
        (["--dask", "local", "--workers", "0"], "--workers 0"),
    ],
)
def test_a_malformed_address_is_one_line(args, says, rank_files, tmp_path):
    r = chiptrace_cmd("import", str(rank_files), "--out", str(tmp_path / "run"), *args)
    assert r.returncode == 2
    assert r.stderr.count("\n") == 1 and says in r.stderr, r.stderr
    assert not (tmp_path / "run").exists()


def test_a_big_file_is_cut_into_block_tasks(cluster, tmp_path):
    """A Kineto file of pool.MIN_POOL_BYTES or more: its blocks are decoded and mapped as
    tasks of their own (`map_block`), and the store is the in-process import's."""
    from distributed import Client, get_task_stream
    from rank_files import write_rank

    from chiptrace.importers.pool import MIN_POOL_BYTES

    inputs = tmp_path / "in"
    inputs.mkdir()
    write_rank(inputs / "rank-0.json", 0, 2, 30)
    write_rank(inputs / "rank-1.json", 1, 2, 1)
    assert (inputs / "rank-0.json").stat().st_size >= MIN_POOL_BYTES
    import_trace(inputs, tmp_path / "local")
    out = tmp_path / "run"
    with Client(cluster.address, timeout=10) as c, get_task_stream(client=c) as ts:
        r = chiptrace_cmd("import", str(inputs), "--out", str(out), "--dask", cluster.address)
    assert r.returncode == 0, r.stderr
    names = [t["key"] for t in ts.data]
    assert sum("map_block" in str(k) for k in names) >= 10, names[:20]
    assert spans_of(out) == spans_of(tmp_path / "local")
