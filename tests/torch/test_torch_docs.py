"""docs/torch.md's blocks run, with PyTorch (the default docs run skips them: no PyTorch).

In document order, in one working directory, as the docs runner runs blocks: Python with
this interpreter, commands in bash with this venv's `chiptrace` first on PATH. Left out:
the `record -- torchrun` block (test_torchrun.py runs that job) and the test command.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.docs.mdblocks import ROOT, blocks_of

pytestmark = pytest.mark.torch

LEFT_OUT = ("torchrun", "pytest")


def test_every_block_of_torch_md_runs(tmp_path, torch):
    blocks = [
        b
        for b in blocks_of(ROOT / "docs" / "torch.md")
        if b.kind in ("python", "sh") and not any(w in b.text for w in LEFT_OUT)
    ]
    assert len(blocks) >= 5
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    for b in blocks:
        cmd = [sys.executable, "-c", b.text] if b.kind == "python" else ["bash", "-ec", b.text]
        # A script of the checkout (benchmarks/gpu_check.sh) runs from its root, as the doc says.
        cwd = ROOT if "benchmarks/" in b.text else tmp_path
        done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, f"{b.where}: {done.stderr[-1500:]}"
    assert (tmp_path / "runs" / "torch-demo" / "spans").is_dir()
