"""The SQL macros `chiptrace query` users call: utilization, busy union, link throughput."""

from __future__ import annotations

from pathlib import Path

from analysis_helpers import MS, T0, US, TraceBuilder

import chiptrace
from chiptrace.cli import main


def _overlapping(b: TraceBuilder) -> None:
    t = b.new_trace()
    root = b.span("step", 0, 100, trace=t)
    b.span("a", 0, 50, trace=t, parent=root, chip="gpu:0")
    b.span("b", 40, 60, trace=t, parent=root, chip="gpu:0")  # overlaps a by 10 us
    b.span("c", 70, 80, trace=t, parent=root, chip="gpu:0")
    wrap = b.span("wrap", 0, 100, trace=t, parent=root, chip="cpu:0")  # has a chip child
    b.span("inner", 10, 20, trace=t, parent=wrap, chip="cpu:0")
    b.span("idle", 20, 90, trace=t, parent=root, chip="cpu:1", op="idle")
    b.span(
        "x",
        10,
        30,
        trace=t,
        parent=root,
        link="nvlink6:gpu:0-gpu:1",
        src="gpu:0",
        dst="gpu:1",
        nbytes=20_000,
    )


def test_busy_is_a_union_and_skips_wrappers_and_idle(tmp_path: Path, builder: TraceBuilder) -> None:
    _overlapping(builder)
    con = chiptrace.connect(builder.write(tmp_path / "t"))
    busy = dict(
        con.sql("SELECT chip_id, sum(end_ns - start_ns) FROM chip_busy() GROUP BY 1").fetchall()
    )
    assert busy == {"gpu:0": 70 * US, "cpu:0": 10 * US}  # 0-60 and 70-80; only `inner` on cpu:0


def test_utilization_windows(tmp_path: Path, builder: TraceBuilder) -> None:
    _overlapping(builder)
    con = chiptrace.connect(builder.write(tmp_path / "t"))
    rows = con.sql(
        "SELECT window_index, chip_id, busy_ns, utilization FROM utilization(0.05) ORDER BY ALL"
    ).fetchall()
    assert (0, "gpu:0", 50 * US, 1.0) in rows
    assert (1, "gpu:0", 20 * US, 0.4) in rows
    assert all(u <= 1.0 for *_, u in rows)
    by_type = con.sql(
        "SELECT chip_type, utilization FROM utilization_by_type(0.1) ORDER BY 1"
    ).fetchall()
    assert by_type == [("cpu", 0.1), ("gpu", 0.7)]


def test_utilization_since_until_clips(tmp_path: Path, builder: TraceBuilder) -> None:
    _overlapping(builder)
    con = chiptrace.connect(builder.write(tmp_path / "t"))
    rows = con.sql(
        f"SELECT chip_id, busy_ns FROM utilization(1, since_ns := {T0 + 45 * US}, "
        f"until_ns := {T0 + 75 * US}) ORDER BY 1"
    ).fetchall()
    # gpu:0 busy 45-60 and 70-75; the wrapper on cpu:0 must stay excluded in a window
    assert rows == [("gpu:0", 20 * US)]


def test_link_throughput_uses_topology_bandwidth(tmp_path: Path, builder: TraceBuilder) -> None:
    _overlapping(builder)
    topo = {"links": [{"id": "nvlink6:gpu:0-gpu:1", "type": "nvlink6", "bandwidth_GBps": 0.01}]}
    con = chiptrace.connect(builder.write(tmp_path / "t", {"topology": topo}))
    rows = con.sql(
        "SELECT window_index, bytes, bytes_per_s, bandwidth_Bps, bandwidth_fraction "
        "FROM link_throughput(0.01) ORDER BY window_index"
    ).fetchall()
    # 20 kB over 10-30 us: half in window 1 (10-20 us), half in window 2
    assert [r[0] for r in rows] == [1, 2]
    assert rows[0][1] == 10_000 and abs(rows[0][2] - 1e9) < 1
    assert rows[0][3] == 1e7 and abs(rows[0][4] - 100.0) < 1e-6


def test_link_throughput_without_topology(tmp_path: Path, builder: TraceBuilder) -> None:
    _overlapping(builder)
    con = chiptrace.connect(builder.write(tmp_path / "t"))
    rows = con.sql("SELECT bandwidth_Bps, bandwidth_fraction FROM link_throughput(1)").fetchall()
    assert rows == [(None, None)]


def test_query_cli_can_call_the_macros(tmp_path: Path, builder: TraceBuilder, capsys) -> None:
    _overlapping(builder)
    d = builder.write(tmp_path / "t")
    assert (
        main(
            ["query", str(d), "SELECT chip_id, busy_ns FROM utilization(1) ORDER BY 1", "-f", "csv"]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "gpu:0" in out and str(70 * US) in out
    assert MS == 1000 * US


def test_analysis_tables_agree_with_the_macros(tmp_path: Path, builder: TraceBuilder) -> None:
    """The report skips the anti-join when no chip span nests another; both paths must
    give the busy time the macros give."""
    from analysis_helpers import training_run

    from chiptrace.analysis import TraceAnalysis

    for d in (training_run(tmp_path / "flat", steps=3), None):
        if d is None:
            _overlapping(builder)
            d = builder.write(tmp_path / "nested")
        con = chiptrace.connect(d)
        want = dict(
            con.sql(
                "SELECT chip_id, CAST(sum(end_ns - start_ns) AS BIGINT) FROM chip_busy() GROUP BY 1"
            ).fetchall()
        )
        got = {r["chip_id"]: r["busy_ns"] for r in TraceAnalysis(con).tables.chips.to_pylist()}
        assert got == want
