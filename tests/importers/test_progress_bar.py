"""`chiptrace import`'s progress bar: drawn on a terminal (a real pty), nothing when piped."""

from __future__ import annotations

import os
import pty
import subprocess
import sys

from tests.importers.conftest import KINETO

FILES = [str(KINETO / "2rank_sampled_rank-0.json.gz"), str(KINETO / "2rank_sampled_rank-1.json.gz")]


def _stderr_on_a_terminal(args: list[str]) -> str:
    master, slave = pty.openpty()
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "chiptrace", *args],
            stdout=subprocess.DEVNULL,
            stderr=slave,
        )
        os.close(slave)
        chunks = []
        while True:
            try:
                data = os.read(master, 4096)
            except OSError:  # EIO: the child closed the terminal
                break
            if not data:
                break
            chunks.append(data)
        assert proc.wait(120) == 0
    finally:
        os.close(master)
    return b"".join(chunks).decode(errors="replace")


def test_a_task_import_draws_files_rate_and_eta_on_a_terminal(tmp_path):
    err = _stderr_on_a_terminal(
        ["import", *FILES, "--out", str(tmp_path / "t"), "--partition-by", "rank"]
    )
    assert "importing [" in err and "/2 files" in err and "spans/s" in err, err
    assert err.endswith("\r"), "the bar is wiped at the end"


def test_nothing_is_drawn_when_piped(tmp_path):
    r = subprocess.run(
        [sys.executable, "-m", "chiptrace", "import", *FILES, "--out", str(tmp_path / "t")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0 and r.stderr == "", r.stderr


def test_an_import_in_process_draws_bytes_on_a_terminal(tmp_path):
    err = _stderr_on_a_terminal(["import", *FILES, "--out", str(tmp_path / "t")])
    assert "importing [" in err and " MiB" in err and "100%" in err, err


def test_a_report_draws_its_stages_on_a_terminal(tmp_path):
    from chiptrace.importers import import_trace

    import_trace(FILES, tmp_path / "t")
    err = _stderr_on_a_terminal(["report", str(tmp_path / "t")])
    assert "reporting [" in err and " stages" in err, err
