"""`chiptrace record -- torchrun ...`: a real two-rank gloo job profiles both ranks into
one store, each rank a chip of its own, steps and collectives in their traces."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import chiptrace
from tests.torch.conftest import ancestors

pytestmark = pytest.mark.torch

JOB = Path(__file__).resolve().parents[2] / "samples" / "torch_ddp.py"


def test_record_torchrun_gives_every_rank_in_one_store(tmp_path, torch):
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "chiptrace", "record", "--no-sample", "--out", str(out), "--"]
    # --standalone, but on 127.0.0.1 (its rendezvous, and gloo's sockets on loopback)
    cmd += [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1"]
    cmd += ["--rdzv-backend", "c10d", "--rdzv-endpoint", "127.0.0.1:0"]
    cmd += ["--nproc-per-node", "2", str(JOB)]
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo"}
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=240, cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "each rank runs under chiptrace.torch.profile()" in done.stderr

    con = chiptrace.connect(out)
    rows = con.sql("SELECT * FROM spans").to_arrow_table().to_pylist()
    for r in rows:
        r["res"] = json.loads(r["resource"])
    ranks = {r["res"]["distributed.rank"] for r in rows}
    assert ranks == {0, 1}
    assert {r["service"] for r in rows} == {"torch_ddp"}  # the script, not torchrun
    for rank in (0, 1):
        mine = [r for r in rows if r["res"]["distributed.rank"] == rank]
        res = mine[0]["res"]
        assert (res["distributed.local_rank"], res["distributed.world_size"]) == (rank, 2)
        assert res["host.name"] == mine[0]["host"]
        by_id = {r["span_id"]: r for r in mine}
        # chip="gpu" is this rank's GPU
        assert {r["chip_id"] for r in mine if r["name"] == "forward"} == {f"gpu:{rank}"}
        steps = [r for r in mine if r["name"] == "step"]
        assert len(steps) == 3
        # profiler ops of the rank sit inside its step spans
        under = [r for r in mine if any(a["name"] == "step" for a in ancestors(r, by_id))]
        assert any(r["name"] == "aten::linear" for r in under)
        assert any(r["name"] == "gloo:all_reduce" for r in under)
        # the wrapped collective is a comm span with its bytes and group
        comms = [r for r in mine if r["name"] == "all_reduce"]
        assert len(comms) == 3
        for c in comms:
            attrs = json.loads(c["attributes"])
            assert (c["op_kind"], c["op_bytes"]) == ("comm", 256 * 4)
            assert attrs["comm.group_size"] == 2 and attrs["comm.group_ranks"] == [0, 1]
            assert by_id[c["parent_span_id"]]["name"] == "step"
        # each optimizer step ended a profiler step
        assert any(r["name"].startswith("ProfilerStep#") for r in mine)
