"""A process forked while another thread was half way through adding a site: the child's
spans carry their own names and tags. Real os.fork(), the child writing its own store."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

import chiptrace
from chiptrace.recording import fastrows as _fastrows
from chiptrace.recording import sites as _sites
from chiptrace.vocab import NO_TAGS


def _fork_child(out: Path, tag: str, before: Callable[[], None] = lambda: None) -> int:
    """Fork a child that records 300 spans on new sites into `out`; returns its pid."""
    pid = os.fork()
    if pid:
        return pid
    code = 1
    try:
        before()
        chiptrace.init(out, flush_interval_s=3600)
        for i in range(300):
            with chiptrace.span(f"{tag}-{i % 30}", link=f"nvlink6:gpu:{i % 30}-gpu:99"):
                pass
        chiptrace.shutdown()
        code = 0
    finally:
        os._exit(code)


def _wait(pid: int) -> int:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.01)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    raise AssertionError("the forked child hung")


def _names_match_links(out: Path, tag: str) -> None:
    con = chiptrace.connect(out)
    try:
        rows = con.sql("SELECT name, link_src FROM spans").fetchall()
    finally:
        con.close()
    assert len(rows) == 300
    # span f"{tag}-{k}" was on link gpu:k -> gpu:99: each name beside its own tags
    assert all(name == f"{tag}-{src.split(':')[1]}" for name, src in rows), rows[:5]


def test_a_child_forked_while_a_thread_was_adding_a_site(tmp_path: Path) -> None:
    # The state site() is in between its appends, under the lock: NAMES one ahead.
    holding, release = threading.Event(), threading.Event()

    def half_add() -> None:
        with _sites._lock:
            _sites.NAMES.append("half-added")
            holding.set()
            release.wait(30)
            _sites.KINDS.append(0)
            _sites.TAGS.append(NO_TAGS)

    t = threading.Thread(target=half_add)
    t.start()
    assert holding.wait(30)
    try:
        pid = _fork_child(tmp_path / "child", "sites-kid")
    finally:
        release.set()
        t.join()
    assert _wait(pid) == 0
    _names_match_links(tmp_path / "child", "sites-kid")


def test_a_child_forked_while_the_writer_was_numbering_sites(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for i in range(1100):  # enough new sites for add() to pause part way
        _sites.site(f"writer-numbering-{i}", NO_TAGS, 0)
    inside, release = threading.Event(), threading.Event()
    real_pause = _fastrows.pause

    def pause_until_released() -> None:
        inside.set()
        release.wait(30)

    monkeypatch.setattr(_fastrows, "pause", pause_until_released)
    t = threading.Thread(target=_fastrows.site_columns, args=(len(_sites.NAMES),))
    t.start()
    assert inside.wait(30)

    def restore() -> None:
        _fastrows.pause = real_pause

    try:
        pid = _fork_child(tmp_path / "child", "writer-kid", restore)
    finally:
        release.set()
        t.join()
    assert _wait(pid) == 0
    _names_match_links(tmp_path / "child", "writer-kid")
