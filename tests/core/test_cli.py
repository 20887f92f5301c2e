from __future__ import annotations

import subprocess
import sys

import pytest

from chiptrace import __version__
from chiptrace.cli import _commands, build_parser, main


def test_version(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0
    assert __version__ in capsys.readouterr().out


@pytest.mark.parametrize("command", [m.NAME for m in _commands()])
def test_every_subcommand_has_help(command, capsys):
    with pytest.raises(SystemExit) as e:
        main([command, "--help"])
    assert e.value.code == 0
    assert "usage: chiptrace " + command in capsys.readouterr().out


def test_console_script_runs():
    out = subprocess.run(
        [sys.executable, "-m", "chiptrace", "--help"], capture_output=True, text=True
    )
    assert out.returncode == 0
    for name in ("demo", "query"):
        assert name in out.stdout
    assert build_parser().prog == "chiptrace"
