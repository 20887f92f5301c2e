"""End to end: emulate() writes a real trace dir that DuckDB reads back."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest

from chiptrace.cli import main
from chiptrace.emulator import emulate
from chiptrace.query import connect
from chiptrace.schema import parse_link
from chiptrace.store import part_files, read_manifests


def _table(out):
    return (
        pq.ParquetDataset([str(p) for p in part_files(out)])
        .read()
        .sort_by([("start_ns", "ascending"), ("span_id", "ascending")])
    )


def test_same_seed_same_span_table_ids_included(tmp_path):
    a = emulate(steps=3, seed=7, out=tmp_path / "a", progress=False)
    b = emulate(steps=3, seed=7, out=tmp_path / "b", progress=False)
    c = emulate(steps=3, seed=8, out=tmp_path / "c", progress=False)
    ta, tb, tc = _table(a.out), _table(b.out), _table(c.out)
    assert ta.num_rows == a.spans > 1000
    assert ta.equals(tb)
    assert not ta.column("span_id").equals(tc.column("span_id"))


def test_manifest_carries_topology_faults_and_source(tmp_path):
    r = emulate(steps=2, seed=1, out=tmp_path / "t", faults=["slow:gpu:3:4"], progress=False)
    (m,) = read_manifests([r.out])
    assert m["source"] == "emulator"
    assert m["faults"] == [
        {"spec": "slow:gpu:3:4", "kind": "slow", "target": "gpu:3", "value": 4.0}
    ]
    chips = {c["id"]: c for c in m["topology"]["chips"]}
    assert chips["gpu:0"]["peak_flops"]["bf16"] == 2.25e15
    links = {lk["id"]: lk for lk in m["topology"]["links"]}
    assert links["nvlink6:gpu:0-switch:0"]["bandwidth_Bps"] == 1.8e12
    assert m["emulation"]["spans"] == m["spans_written"] == r.spans


def test_span_tree_chip_ops_transfers_and_links(tmp_path):
    r = emulate(steps=2, seed=1, out=tmp_path / "t", progress=False)
    con = connect(r.out)
    roots = con.sql("SELECT count(*) FROM spans WHERE parent_span_id IS NULL").fetchall()[0][0]
    assert roots == 2
    orphans = con.sql(
        "SELECT count(*) FROM spans s LEFT JOIN spans p ON s.parent_span_id = p.span_id "
        "WHERE s.parent_span_id IS NOT NULL AND p.span_id IS NULL"
    ).fetchall()[0][0]
    assert orphans == 0
    phases = {
        n
        for (n,) in con.sql(
            "SELECT DISTINCT name FROM spans WHERE parent_span_id IN "
            "(SELECT span_id FROM spans WHERE parent_span_id IS NULL)"
        ).fetchall()
    }
    assert phases == {"input", "forward", "backward", "allreduce", "optimizer"}
    for link_id, src, dst in con.sql(
        "SELECT DISTINCT link_id, link_src, link_dst FROM spans WHERE link_id IS NOT NULL"
    ).fetchall():
        lk = parse_link(link_id)
        assert {src, dst} == {lk.src, lk.dst}
    assert (
        con.sql(
            "SELECT count(*) FROM spans WHERE chip_id IS NOT NULL AND op_kind = 'compute' "
            "AND (op_flops IS NULL OR op_precision IS NULL)"
        ).fetchall()[0][0]
        == 0
    )
    # Every forward pass's first layer links to the host-to-device copy that fed it (in the
    # trace of the step it was prefetched in).
    rows = con.sql("SELECT s.links, s.trace_id FROM spans s WHERE s.name = 'fwd.0'").fetchall()
    assert len(rows) == 16
    for links, _ in rows:
        (target,) = json.loads(links)
        name = con.sql(
            f"SELECT name FROM spans WHERE span_id = '{target['span_id']}' "
            f"AND trace_id = '{target['trace_id']}'"
        ).fetchall()
        assert name == [("h2d",)]


def test_prefetched_input_sits_in_the_step_it_runs_in(tmp_path):
    r = emulate(steps=3, seed=1, out=tmp_path / "t", progress=False)
    con = connect(r.out)
    early = con.sql(
        "SELECT count(*) FROM spans c JOIN spans p "
        "ON c.trace_id = p.trace_id AND c.parent_span_id = p.span_id WHERE c.start_ns < p.start_ns"
    ).fetchall()[0][0]
    assert early == 0  # no child before its parent
    # A trace lasts as long as its step (Jaeger's trace duration is the root's).
    for trace_ns, root_ns in con.sql(
        "SELECT max(s.end_ns) - min(s.start_ns), any_value(r.duration_ns) FROM spans s "
        "JOIN spans r ON r.trace_id = s.trace_id AND r.parent_span_id IS NULL GROUP BY s.trace_id"
    ).fetchall():
        assert trace_ns <= root_ns
    # Step s's input runs during step s-1, under its root, linked to step s's root.
    rows = con.sql(
        "SELECT i.links, i.attributes, r.attributes FROM spans i JOIN spans r "
        "ON r.span_id = i.parent_span_id WHERE i.name = 'input' AND i.links IS NOT NULL "
        "ORDER BY i.start_ns"
    ).fetchall()
    assert len(rows) == 2
    for links, attrs, parent_attrs in rows:
        step = json.loads(attrs)["train.for_step"]
        assert json.loads(parent_attrs)["train.step"] == step - 1
        (lk,) = json.loads(links)
        target = con.sql(
            f"SELECT name, attributes FROM spans WHERE span_id = '{lk['span_id']}' "
            f"AND trace_id = '{lk['trace_id']}'"
        ).fetchall()
        assert target[0][0] == "train_step" and json.loads(target[0][1])["train.step"] == step


def test_down_link_reroutes_and_is_recorded(tmp_path):
    r = emulate(
        steps=1, seed=1, out=tmp_path / "t", faults=["down:nvlink6:gpu:1-switch:0"], progress=False
    )
    con = connect(r.out)
    used = {
        x
        for (x,) in con.sql(
            "SELECT DISTINCT link_id FROM spans WHERE link_id IS NOT NULL"
        ).fetchall()
    }
    assert "nvlink6:gpu:1-switch:0" not in used and "c2c:gpu:1-cpu:0" in used


def test_cli_emulate_writes_a_trace(tmp_path, capsys):
    out = tmp_path / "cli"
    rc = main(
        [
            "emulate",
            "--topology",
            "rack6",
            "--workload",
            "train",
            "--steps",
            "2",
            "--seed",
            "1",
            "--out",
            str(out),
            "--fault",
            "straggler:gpu:2:0.5",
            "--no-progress",
        ]
    )
    assert rc == 0
    assert "2 train steps on rack6" in capsys.readouterr().out
    con = connect(out)
    last = dict(
        con.sql(
            "SELECT chip_id, max(start_ns) FROM spans WHERE name = 'fwd.0' GROUP BY ALL"
        ).fetchall()
    )
    assert last["gpu:2"] - last["gpu:1"] == pytest.approx(0.5e6, abs=1)


def test_inference_is_deterministic_too(tmp_path):
    a = emulate(workload="infer", steps=5, seed=2, out=tmp_path / "a", progress=False)
    b = emulate(workload="infer", steps=5, seed=2, out=tmp_path / "b", progress=False)
    assert _table(a.out).equals(_table(b.out))


class _Collect:
    """A real span sink: keeps what the recorder hands it."""

    def __init__(self) -> None:
        self.rows, self.closed = 0, False

    def write(self, batch) -> None:
        self.rows += batch.num_rows

    def close(self) -> None:
        self.closed = True


def test_realtime_run_feeds_extra_sinks_and_maps_to_wall_time(tmp_path):
    import time

    sink = _Collect()
    before = time.time_ns()
    r = emulate(
        steps=2,
        seed=1,
        out=tmp_path / "rt",
        realtime=True,
        speed=50.0,
        sinks=[sink],
        progress=False,
    )
    assert sink.closed and sink.rows == r.spans
    first = connect(r.out).sql("SELECT min(start_ns) FROM spans").fetchall()[0][0]
    assert first >= before  # virtual t=0 is the run's wall-clock start, not the fixed epoch


def test_demo_runs_the_default_rack_and_prints_a_summary(tmp_path, capsys):
    from chiptrace.cli import main as cli

    rc = cli(["demo", "--seconds", "0.3", "--speed", "2", "--out", str(tmp_path / "demo")])
    out = capsys.readouterr().out
    assert rc == 0
    assert "rack6" in out and "nvlink6" in out and "backward" in out
    (m,) = read_manifests([tmp_path / "demo"])
    assert m["topology"]["name"] == "rack6" and m["emulation"]["realtime"] is True


def test_progress_bar_on_stderr(tmp_path, capsys):
    emulate(steps=3, seed=1, out=tmp_path / "p", progress=True)
    err = capsys.readouterr().err
    assert "3/3 steps" in err and "#" in err


def test_cli_takes_a_topology_path(tmp_path, capsys):
    from pathlib import Path

    from chiptrace.cli import main as cli

    path = Path(__file__).resolve().parents[2] / "samples" / "topologies" / "mixed_npu.toml"
    rc = cli(
        [
            "emulate",
            "--topology",
            str(path),
            "--workload",
            "infer",
            "--schedule",
            "dynamic",
            "--steps",
            "12",
            "--out",
            str(tmp_path / "m"),
            "--no-progress",
        ]
    )
    assert rc == 0, capsys.readouterr().err
    used = {
        c
        for (c,) in connect(tmp_path / "m")
        .sql("SELECT DISTINCT chip_id FROM spans WHERE name = 'prefill' AND chip_id IS NOT NULL")
        .fetchall()
    }
    assert {"gpu:0", "npu:0"} <= used


def test_multi_hop_transfer_is_one_span_per_hop_with_one_interval(tmp_path):
    r = emulate(steps=1, seed=1, out=tmp_path / "h", progress=False)
    rows = (
        connect(r.out)
        .sql("SELECT start_ns, end_ns, link_src, link_dst FROM spans WHERE name = 'h2d'")
        .fetchall()
    )
    assert len(rows) == 16  # 8 ranks, each fed DPU -> CPU -> GPU: two hops
    last = [x for x in rows if x[3].startswith("gpu:")]
    assert len(last) == 8
    for start, end, cpu, _gpu in last:
        # cut through: the first hop, into that CPU from a DPU, has the very same interval
        assert any(x[:2] == (start, end) and x[3] == cpu and x[2].startswith("dpu:") for x in rows)


def test_same_seed_same_table_across_processes(tmp_path):
    import os
    import subprocess
    import sys

    code = (
        "import sys; from chiptrace.emulator import emulate; "
        "emulate(workload=sys.argv[1], steps=2, seed=5, out=sys.argv[2], progress=False)"
    )
    for hashseed, name in (("1", "a"), ("2", "b")):
        env = {**os.environ, "PYTHONHASHSEED": hashseed}
        subprocess.run(
            [sys.executable, "-c", code, "infer", str(tmp_path / name)],
            env=env,
            check=True,
            timeout=120,
        )
    assert _table(tmp_path / "a").equals(_table(tmp_path / "b"))


def test_roots_carry_generic_attributes(tmp_path):
    r = emulate(steps=2, seed=1, out=tmp_path / "a", progress=False)
    rows = (
        connect(r.out)
        .sql("SELECT attributes FROM spans WHERE name = 'train_step' ORDER BY start_ns")
        .fetchall()
    )
    assert [json.loads(a)["train.step"] for (a,) in rows] == [0, 1]
    r = emulate(workload="infer", steps=2, seed=1, out=tmp_path / "i", progress=False)
    (a,) = (
        connect(r.out)
        .sql("SELECT any_value(attributes) FROM spans WHERE name = 'request'")
        .fetchall()[0]
    )
    assert json.loads(a)["request.prompt_tokens"] > 0


def test_cli_list_and_scenario(tmp_path, capsys):
    from chiptrace.cli import main as cli

    assert cli(["emulate", "--list"]) == 0
    text = capsys.readouterr().out
    assert "rack6" in text and "nvl72" in text and "thin_dpu" in text
    rc = cli(
        [
            "emulate",
            "--scenario",
            "pcie_baseline",
            "--fault",
            "slow:gpu:1:2",
            "--steps",
            "1",
            "--out",
            str(tmp_path / "s"),
            "--no-progress",
        ]
    )
    assert rc == 0 and "on pcie8" in capsys.readouterr().out
    (m,) = read_manifests([tmp_path / "s"])
    assert m["topology"]["name"] == "pcie8" and m["faults"][0]["target"] == "gpu:1"
    assert cli(["emulate", "--scenario", "nope", "--out", str(tmp_path / "n")]) == 2
    assert "unknown; expected one of baseline" in capsys.readouterr().err
