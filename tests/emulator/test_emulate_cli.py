"""`chiptrace emulate` and `chiptrace demo` at their edges: an --out that already holds a
trace, a full disk (a small tmpfs, when running as root), a run of no length."""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from chiptrace.cli import main
from chiptrace.query import connect


def test_a_non_empty_out_needs_append_which_gets_new_ids(tmp_path, capsys) -> None:
    out = tmp_path / "t"
    assert main(["emulate", "--steps", "2", "--seed", "1", "--out", str(out), "--no-progress"]) == 0
    first = capsys.readouterr().out
    made = connect(out).sql("SELECT count(*) FROM spans").fetchall()[0][0]
    assert f"{made:,} spans stored" in first

    assert main(["emulate", "--steps", "2", "--seed", "1", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert "is not empty" in err and "--append" in err and len(err.splitlines()) == 1
    assert connect(out).sql("SELECT count(*) FROM spans").fetchall()[0][0] == made

    args = ["emulate", "--steps", "2", "--seed", "1", "--out", str(out), "--append"]
    assert main([*args, "--no-progress"]) == 0
    n, ids, traces = (
        connect(out)
        .sql("SELECT count(*), count(DISTINCT span_id), count(DISTINCT trace_id) FROM spans")
        .fetchall()[0]
    )
    assert n == ids == 2 * made and traces == 4


def test_out_that_is_a_file_is_refused(tmp_path, capsys) -> None:
    f = tmp_path / "file"
    f.write_text("x")
    assert main(["emulate", "--steps", "1", "--out", str(f)]) == 2
    assert "is a file" in capsys.readouterr().err


@contextlib.contextmanager
def _tmpfs(path: Path, size: str) -> Iterator[Path]:
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    path.mkdir()
    r = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True
    )
    if r.returncode != 0:
        pytest.skip(f"cannot mount tmpfs here: {r.stderr.decode().strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def test_full_disk_is_one_line_and_a_non_zero_exit(tmp_path, capsys) -> None:
    with _tmpfs(tmp_path / "small", "256k") as small:
        rc = main(["emulate", "--steps", "40", "--out", str(small / "run"), "--no-progress"])
        out, err = capsys.readouterr()
        assert rc != 0 and out == ""
        (line,) = err.strip().splitlines()
        assert (
            "No space left on device" in line
            and "dropped" in line
            and line.startswith("chiptrace: error: stored 0 of")
        )

    with _tmpfs(tmp_path / "full", "64k") as full:
        with contextlib.suppress(OSError):  # full before the run starts
            (full / "filler").write_bytes(b"\0" * (1 << 20))
        rc = main(["emulate", "--steps", "2", "--out", str(full / "run"), "--no-progress"])
        (line,) = capsys.readouterr().err.strip().splitlines()
        assert rc == 2 and "cannot write to trace dir" in line and "No space left" in line


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--seconds", "0"], "--seconds 0: expected emulated seconds > 0"),
        (["--steps", "0"], "--steps 0"),
    ],
)
def test_demo_of_no_length_is_a_clear_error(tmp_path, capsys, argv, needle) -> None:
    assert main(["demo", "--no-ui", "--out", str(tmp_path / "d"), *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and len(err.splitlines()) == 1
    assert not (tmp_path / "d").exists()
