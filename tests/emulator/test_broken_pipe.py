"""`chiptrace ... | head -1` ends quietly: no BrokenPipeError traceback, exit 0 (issue 23).

Real pipes to real subprocesses. The reader closes its end before the command writes (or
after one line of output far larger than a pipe's buffer), so the write that fails is
certain, not a race with the reader.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from chiptrace.emulator import emulate


@pytest.fixture(scope="module")
def trace(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("pipe") / "t"
    emulate(steps=2, seed=1, out=out, progress=False)
    return out


def _closed_early(args: list[str], read_first_line: bool) -> tuple[int, str]:
    """Run `chiptrace ARGS` into a pipe whose reader leaves: at once, or after one line."""
    p = subprocess.Popen(
        [sys.executable, "-m", "chiptrace", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert p.stdout is not None and p.stderr is not None
    if read_first_line:
        assert p.stdout.readline()
    p.stdout.close()
    err = p.stderr.read().decode()
    return p.wait(timeout=120), err


def test_emulate_into_a_closed_pipe_ends_quietly(tmp_path):
    rc, err = _closed_early(
        ["emulate", "--steps", "1", "--no-progress", "--out", str(tmp_path / "e")],
        read_first_line=False,
    )
    assert (rc, err) == (0, "")
    assert (tmp_path / "e" / "manifest.json").exists() or any((tmp_path / "e").iterdir())


@pytest.mark.parametrize(
    "args",
    [
        ["query", "{dir}", "SELECT * FROM range(400000)", "--format", "csv"],
        ["report", "{dir}"],
        ["export", "{dir}", "--format", "chrome", "-o", "-"],
        ["export", "{dir}", "--format", "jaeger-json", "-o", "-"],
        ["query", "--help"],
    ],
)
def test_commands_that_print_a_lot_end_quietly_under_head(trace, args):
    argv = [a.replace("{dir}", str(trace)) for a in args]
    rc, err = _closed_early(argv, read_first_line=argv[0] == "query")
    assert "Traceback" not in err and "BrokenPipe" not in err and "Broken pipe" not in err
    assert (rc, err) == (0, ""), argv
