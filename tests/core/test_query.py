from __future__ import annotations

import csv
import io
import json

import pyarrow.parquet as pq
import pytest

import chiptrace
from chiptrace.cli import main


@pytest.fixture
def two_dirs(tmp_path):
    for i, chip in enumerate(("gpu:0", "npu:1")):
        chiptrace.init(tmp_path / f"run{i}")
        for _ in range(3 + i):
            with chiptrace.span("k", chip=chip) as s:
                s.set_attribute("op.bytes", 10)
        with chiptrace.span("x", link="nvlink5:gpu:0-gpu:1") as s:
            s.set_attribute("op.bytes", 1000)
        chiptrace.shutdown()
    return tmp_path


def test_views(two_dirs):
    con = chiptrace.connect(two_dirs / "run0")
    row = con.sql(
        "SELECT trace_id, span_id, duration_ns, start_time FROM spans LIMIT 1"
    ).fetchall()[0]
    assert len(row[0]) == 32 and len(row[1]) == 16 and row[2] >= 0 and row[3] is not None
    assert con.sql("SELECT chip_id, chip_type, spans FROM chips").fetchall() == [
        ("gpu:0", "gpu", 3)
    ]
    assert con.sql("SELECT link_type, transfers, bytes FROM links").fetchall() == [
        ("nvlink5", 1, 1000)
    ]
    assert con.sql("SELECT count(*) FROM runs WHERE service IS NOT NULL").fetchall()[0][0] == 1


def test_many_dirs_and_globs_query_as_one(two_dirs):
    con = chiptrace.connect([two_dirs / "run0", two_dirs / "run1"])
    assert con.sql("SELECT count(*) FROM spans").fetchall()[0][0] == 9
    con = chiptrace.connect(str(two_dirs / "run*"))
    assert con.sql("SELECT count(*) FROM chips").fetchall()[0][0] == 2


def test_cli_formats(two_dirs, tmp_path, capsys):
    d = str(two_dirs / "run*")
    sql = "SELECT chip_type, count(*) AS n FROM spans WHERE chip_type IS NOT NULL GROUP BY 1 ORDER BY 1"
    assert main(["query", d, sql]) == 0
    out = capsys.readouterr().out
    assert "chip_type" in out and "gpu" in out and "(2 rows)" in out
    assert main(["query", d, sql, "--format", "csv"]) == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert rows == [{"chip_type": "gpu", "n": "3"}, {"chip_type": "npu", "n": "4"}]
    assert main(["query", d, sql, "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out) == [
        {"chip_type": "gpu", "n": 3},
        {"chip_type": "npu", "n": 4},
    ]
    target = tmp_path / "out.parquet"
    assert main(["query", d, sql, "--format", "parquet", "-o", str(target)]) == 0
    assert pq.read_table(target).num_rows == 2


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["/nonexistent/trace", "SELECT 1"], "does not exist"),
        (["{empty}", "SELECT 1"], "no trace parts"),
        (["{run0}", "SELEC nope"], "SQL error"),
        (["{run0}", "SELECT missing_col FROM spans"], "SQL error"),
    ],
)
def test_cli_bad_input_is_one_line(two_dirs, tmp_path, capsys, args, message):
    (tmp_path / "empty").mkdir()
    args = [a.format(empty=tmp_path / "empty", run0=two_dirs / "run0") for a in args]
    assert main(["query", *args]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_format_cell_is_the_one_cell_formatter() -> None:
    from chiptrace.query import format_cell

    assert [format_cell(v) for v in (None, b"\x00\xab", 1 / 3, 7, "x")] == [
        "NULL",
        "00ab",
        "0.333333",
        "7",
        "x",
    ]
    assert format_cell(None, null="") == ""
