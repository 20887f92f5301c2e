from __future__ import annotations

import concurrent.futures as cf
import gc
import http.server
import multiprocessing as mp
import subprocess
import sys
import threading
import urllib.request

import chiptrace
from chiptrace.propagation import attach


def _rank(rank: int, n: int) -> int:
    # a child of the caller's span, in another process
    with chiptrace.span(f"rank{rank}", chip=f"gpu:{rank}"):
        for i in range(n):
            with chiptrace.span("op", chip=f"gpu:{rank}") as s:
                s.set_attribute("i", i)
    return rank


def _check_one_trace(directory, expected: int) -> None:
    con = chiptrace.connect(directory)
    total, traces = con.sql("SELECT count(*), count(DISTINCT trace_id) FROM spans").fetchall()[0]
    assert (total, traces) == (expected, 1)
    orphans = con.sql(
        "SELECT count(*) FROM spans c WHERE parent_span_id IS NOT NULL "
        "AND parent_span_id NOT IN (SELECT span_id FROM spans)"
    ).fetchall()[0][0]
    assert orphans == 0
    dup = con.sql("SELECT count(*) - count(DISTINCT span_id) FROM spans").fetchall()[0][0]
    assert dup == 0


def test_four_processes_ten_thousand_spans_one_trace(tmp_path):
    out = tmp_path / "mp"
    chiptrace.init(out)
    # DuckDB connections earlier tests left to the garbage collector would be freed in the
    # forked children, whose copy of DuckDB's threads is gone: a segfault there.
    gc.collect()
    with chiptrace.span("allreduce_job"):
        procs = [mp.Process(target=chiptrace.in_context(_rank), args=(r, 10_000)) for r in range(4)]
        for p in procs:
            p.start()
        for p in procs:
            p.join()
    chiptrace.shutdown()
    assert all(p.exitcode == 0 for p in procs)
    _check_one_trace(out, 1 + 4 * 10_001)
    con = chiptrace.connect(out)
    assert con.sql("SELECT count(DISTINCT pid) FROM spans").fetchall()[0][0] == 5


def test_process_pool_spawn_joins_the_trace(tmp_path):
    out = tmp_path / "pool"
    chiptrace.init(out)
    with chiptrace.span("submit"):
        ctx = mp.get_context("spawn")
        with cf.ProcessPoolExecutor(2, mp_context=ctx) as pool:
            assert sorted(pool.map(chiptrace.in_context(_rank), [0, 1], [5, 5])) == [0, 1]
    chiptrace.shutdown()
    _check_one_trace(out, 1 + 2 * 6)


def test_subprocess_inherits_trace_through_environment(tmp_path):
    out = tmp_path / "sub"
    chiptrace.init(out)
    code = "import chiptrace\nwith chiptrace.span('child', chip='cpu:1'): pass"
    with chiptrace.span("parent"):
        subprocess.run([sys.executable, "-c", code], env=chiptrace.subprocess_env(), check=True)
    chiptrace.shutdown()
    _check_one_trace(out, 2)


def test_http_inject_and_extract(tmp_path):
    out = tmp_path / "http"
    chiptrace.init(out)

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            with attach(dict(self.headers)), chiptrace.span("server", chip="cpu:0"):
                self.send_response(200)
                self.end_headers()

        def log_message(self, *a):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    serving = threading.Thread(target=server.handle_request, daemon=True)
    serving.start()
    with chiptrace.span("client"):
        req = urllib.request.Request(
            f"http://127.0.0.1:{server.server_port}/", headers=chiptrace.inject()
        )
        assert urllib.request.urlopen(req, timeout=10).status == 200
    serving.join(10)  # the server span ends after the response is sent
    server.server_close()
    chiptrace.shutdown()
    _check_one_trace(out, 2)


def test_multiprocess_allreduce_sample_is_one_trace(tmp_path):
    from pathlib import Path

    sample = Path(__file__).resolve().parents[2] / "samples" / "multiprocess_allreduce.py"
    out = tmp_path / "ring"
    subprocess.run(
        [sys.executable, str(sample), str(out)], check=True, timeout=120, capture_output=True
    )
    _check_one_trace(out, 1 + 4 * 14)
