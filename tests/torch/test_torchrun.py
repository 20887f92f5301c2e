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

    # the report: each rank its own CPU chip, its own steps (named by the program's `step`
    # spans), the collectives' share of them, and the top ops by self time
    from chiptrace.analysis import TraceAnalysis

    # every step sampled, so the report's share is over the same steps as the SQL's below
    rep = TraceAnalysis(out, sample_steps=100).report().to_dict()
    assert {c["chip_id"] for c in rep["chips"] if c["chip_type"] == "cpu"} == {
        "rank0/cpu:0",
        "rank1/cpu:0",
    }
    w = rep["workloads"][0]
    assert (w["step"], w["steps"], w["ranks"], w["training"]) == ("step", 6, 2, True)
    assert 0 < w["comm_share"] <= 1
    # the collectives' time in the steps (gloo:*, c10d::*, comm spans; merged), by SQL
    ((share,),) = con.execute(
        """WITH RECURSIVE t(span_id, trace_id, root) AS (
               SELECT span_id, trace_id, span_id FROM spans WHERE name = 'step'
               UNION ALL SELECT s.span_id, s.trace_id, t.root FROM spans s
               JOIN t ON s.parent_span_id = t.span_id AND s.trace_id = t.trace_id),
           c AS (SELECT t.root, greatest(s.start_ns, r.start_ns) AS a,
                        least(s.end_ns, r.end_ns) AS b
                 FROM t JOIN spans s USING (span_id, trace_id) JOIN spans r ON r.span_id = t.root
                 WHERE s.span_id <> t.root AND (s.name LIKE 'gloo:%' OR s.name LIKE 'c10d::%'
                       OR s.op_kind = 'comm')),
           m AS (SELECT *, max(b) OVER (PARTITION BY root ORDER BY a, b
                        ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS prev FROM c),
           g AS (SELECT *, sum(CASE WHEN prev IS NULL OR a > prev THEN 1 ELSE 0 END)
                        OVER (PARTITION BY root ORDER BY a, b) AS gid FROM m),
           u AS (SELECT root, gid, min(a) AS a, max(b) AS b FROM g GROUP BY ALL)
           SELECT (SELECT sum(b - a) FROM u WHERE b > a)
                  / (SELECT sum(duration_ns) FROM spans WHERE name = 'step')"""
    ).fetchall()
    # (the report reads a step's spans from its start: a collective a gloo thread began
    # just before it counts from there, not from the step's start)
    assert w["comm_share"] == pytest.approx(share, abs=0.03)
    names = {r["name"] for r in rep["time_breakdown"]}
    assert any(n.startswith("aten::") or n.startswith("gloo:") for n in names)
    assert "PyTorch Profiler (0)" not in names
