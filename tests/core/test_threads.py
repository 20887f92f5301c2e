"""Many threads at once: spans, new sites, rolls and flushes racing; every span stored
with its own name and tags. And the free-threaded refusal (one line, tracing off)."""

from __future__ import annotations

import logging
import sys
import threading
from pathlib import Path

import pytest

import chiptrace
from chiptrace import lifecycle


def test_threads_racing_spans_sites_and_flushes_lose_nothing(tmp_path: Path) -> None:
    rec = chiptrace.init(tmp_path / "t", flush_interval_s=0.05, flush_spans=3000)
    assert rec is not None
    n_threads, per_thread = 6, 4000
    start = threading.Barrier(n_threads + 1)
    errors: list[BaseException] = []

    def work(k: int) -> None:
        try:
            start.wait(10)
            for i in range(per_thread):
                # New sites all the time (name and link per thread and i), racing the
                # writer reading the site table.
                with chiptrace.span(f"t{k}-{i % 97}", link=f"nvlink6:gpu:{k}-gpu:{i % 53}"):
                    pass
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(n_threads)]
    for t in threads:
        t.start()
    start.wait(10)
    while any(t.is_alive() for t in threads):
        chiptrace.flush()  # the program flushing too, from another thread
    for t in threads:
        t.join()
    chiptrace.shutdown()
    assert not errors
    assert rec.dropped == 0
    con = chiptrace.connect(tmp_path / "t")
    rows = con.sql(
        "SELECT count(*), count(DISTINCT name), "
        "count(*) FILTER (WHERE split_part(name, '-', 1) = 't' || split_part("
        "split_part(link_id, ':', 3), '-', 1)) FROM spans"
    ).fetchall()
    assert rows == [(n_threads * per_thread, n_threads * 97, n_threads * per_thread)]


def test_free_threaded_python_refuses_with_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(sys, "_is_gil_enabled", lambda: False, raising=False)
    with caplog.at_level(logging.WARNING, logger="chiptrace"):
        assert chiptrace.init(tmp_path / "t") is None
    try:
        assert [r.getMessage() for r in caplog.records if "GIL" in r.getMessage()]
        assert not lifecycle._STATE.enabled
    finally:
        monkeypatch.undo()
        chiptrace.init(tmp_path / "u", enabled=True)
        chiptrace.shutdown()


def test_shutdown_from_a_thread_while_the_main_thread_flushes(tmp_path: Path) -> None:
    rec = chiptrace.init(tmp_path / "t", flush_interval_s=3600)
    assert rec is not None
    for _ in range(20_000):
        with chiptrace.span("w"):
            pass
    stopper = threading.Thread(target=rec.shutdown, kwargs={"timeout_s": 30})
    stopper.start()
    while stopper.is_alive():
        rec.flush(timeout_s=30)  # racing the shutdown's own last flush: neither waits forever
    stopper.join()
    chiptrace.shutdown()
    assert rec._done.is_set() and not rec.gave_up and rec.dropped == 0
    con = chiptrace.connect(tmp_path / "t")
    assert con.sql("SELECT count(*) FROM spans").fetchall()[0][0] == 20_000
    con.close()


def test_a_flush_that_ends_after_shutdown_gave_up_is_not_counted_twice(tmp_path: Path) -> None:
    import time

    from chiptrace.store import read_manifests

    out = tmp_path / "t"
    rec = chiptrace.init(out, flush_interval_s=3600, flush_spans=10**9)
    assert rec is not None
    n = 200_000
    for _ in range(n):
        with chiptrace.span("w"):
            pass
    gave_up: list[bool] = []

    def impatient() -> None:  # shutdown with a short deadline, during the main's flush
        while not rec._in_flight:
            time.sleep(0.0005)
        gave_up.append(not rec.shutdown(timeout_s=0.001))

    t = threading.Thread(target=impatient)
    t.start()
    assert chiptrace.flush() == n  # the flush in flight completes: every span is written
    t.join()
    chiptrace.shutdown()
    # The give-up counted the flush's spans as dropped while it ran; written after all,
    # they come off that count (the manifest said 200,000 written and 200,000 dropped).
    (m,) = read_manifests([out])
    assert gave_up == [True]
    assert (m["spans_written"], m["spans_dropped"], rec.dropped) == (n, 0, 0)
