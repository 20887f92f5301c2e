"""Ranks as chips and the bad-input lines; what does not need PyTorch runs everywhere."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import chiptrace
from chiptrace import config
from chiptrace.schema import Tags


def _python(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        timeout=120,
    )


def test_import_chiptrace_never_imports_torch():
    done = _python("import sys, chiptrace; chiptrace.span('x'); print('torch' in sys.modules)")
    assert done.stdout.strip() == "False"


def test_chiptrace_torch_without_torch_names_the_extra():
    # `sys.modules["torch"] = None` makes `import torch` fail as where it is not installed.
    done = _python("import sys; sys.modules['torch'] = None; import chiptrace.torch")
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert last == (
        "chiptrace.torch.TorchMissingError: chiptrace.torch needs PyTorch, which is not "
        "installed: pip install 'chiptrace[torch]' (or torch itself)"
    )
    assert "During handling" not in done.stderr  # one error, not a chain


def test_a_bare_gpu_is_this_ranks_gpu(monkeypatch):
    monkeypatch.setenv("LOCAL_RANK", "3")
    assert Tags.build(chip="gpu").chip_id == "gpu:3"
    assert Tags.build(chip="npu").chip_id == "npu:3"
    assert Tags.build(chip="gpu:1").chip_id == "gpu:1"  # an explicit index stays
    monkeypatch.delenv("LOCAL_RANK")
    assert Tags.build(chip="gpu").chip_id == "gpu:0"  # one process: rank 0
    with pytest.raises(chiptrace.ChipError, match="expected TYPE:INDEX"):
        Tags.build(chip="cpu")


def test_a_rank_carries_rank_local_rank_world_size_and_host():
    env = {"RANK": "5", "LOCAL_RANK": "1", "WORLD_SIZE": "8"}
    cfg = config.resolve(env=env, host="node2")
    assert cfg.resource == {
        "distributed.rank": 5,
        "distributed.local_rank": 1,
        "distributed.world_size": 8,
        "host.name": "node2",
    }
    assert config.resolve(env={}, host="node2").resource == {}
    # The names are generic: a value torchrun would not set is not chiptrace's to refuse.
    assert config.resolve(env={"RANK": "high"}).resource == {}


def test_spans_of_a_rank_name_its_gpu_and_carry_the_rank(tmp_path):
    code = (
        "import chiptrace\n"
        f"chiptrace.init({str(tmp_path / 'run')!r})\n"
        "with chiptrace.span('fwd', chip='gpu'): pass\n"
        "chiptrace.shutdown()\n"
    )
    done = _python(code, RANK="3", LOCAL_RANK="1", WORLD_SIZE="4")
    assert done.returncode == 0, done.stderr
    con = chiptrace.connect(tmp_path / "run")
    chip, rank = con.execute("SELECT chip_id, resource->>'distributed.rank' FROM spans").fetchone()
    assert (chip, rank) == ("gpu:1", "3")


@pytest.mark.torch
def test_comm_of_something_not_callable_says_what_it_expects(torch):
    import chiptrace.torch

    with pytest.raises(TypeError, match="expects a torch.distributed collective"):
        chiptrace.torch.comm(torch.ones(2))


@pytest.mark.torch
def test_comm_outside_a_process_group_still_records_the_bytes(trace_dir, torch):
    import chiptrace.torch

    def all_reduce(t, group=None):  # what a collective looks like to comm()
        return t.sum()

    out = chiptrace.torch.comm(all_reduce, torch.ones(16, dtype=torch.float64))
    assert float(out) == 16
    chiptrace.flush()
    row = (
        chiptrace.connect(trace_dir).execute("SELECT name, op_kind, op_bytes FROM spans").fetchone()
    )
    assert row == ("all_reduce", "comm", 128)


@pytest.mark.torch
def test_torchrun_commands_are_rewritten_to_profile_each_rank(torch):
    from chiptrace.cli._torchrun import wrap

    assert wrap(["torchrun", "--nproc-per-node", "2", "train.py", "--lr", "1"]) == (
        ["torchrun", "--nproc-per-node", "2", "-m", "chiptrace.torch", "train.py", "--lr", "1"],
        None,
    )
    assert wrap(["torchrun", "--nproc=2", "-m", "pkg.train"])[0] == [
        "torchrun",
        "--nproc=2",
        "-m",
        "chiptrace.torch",
        "-m",
        "pkg.train",
    ]
    assert wrap(["python3", "-m", "torch.distributed.run", "-r3", "t.py"])[0][-3:] == [
        "-m",
        "chiptrace.torch",
        "t.py",
    ]
    for cmd, why in (
        (["torchrun", "--no-python", "bash"], "runs no Python script"),
        (["torchrun", "--bogus", "t.py"], "unknown torchrun option '--bogus'"),
        (["torchrun", "--nnodes", "1"], "no training script"),
        (["python3", "train.py"], "not a torchrun command"),
    ):
        unchanged, reason = wrap(cmd)
        assert unchanged == cmd and why in reason
