"""A trace dir with a bad part stays usable: each part's schema is checked on open, a part
that does not fit or does not decode is skipped with one warning naming it, and every
command goes on. Temporary files left by a killed writer are removed, a live one's never."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import chiptrace
from chiptrace.cli import main
from chiptrace.schema import SCHEMA_VERSION_KEY
from chiptrace.store import part_files, remove_stale_temps
from chiptrace.viewer.sources import DirSource, SpanFeed


def _good_dir(out: Path, parts: int = 2, per: int = 300) -> list[Path]:
    chiptrace.init(out, flush_interval_s=3600)
    try:
        for _ in range(parts):
            for i in range(per):
                with chiptrace.span(f"op{i % 3}", chip="gpu:0") as s:
                    s.set_attribute("op.bytes", i)
            chiptrace.flush()
    finally:
        chiptrace.shutdown()
    return part_files(out)


def _wrong_type_part(out: Path) -> Path:
    """A part whose start_ns is text: DuckDB would promote the column and every query
    subtracting times would fail to bind."""
    good = pq.read_table(part_files(out)[0])
    idx = good.schema.get_field_index("start_ns")
    bad = good.set_column(idx, "start_ns", pa.array([str(v) for v in good["start_ns"].to_pylist()]))
    path = out / "spans" / "part-wrongtype-000001.parquet"
    pq.write_table(bad, path)
    return path


def _foreign_part(out: Path) -> Path:
    path = out / "spans" / "part-foreign-000001.parquet"
    pq.write_table(pa.table({"a": [1, 2, 3], "b": ["x", "y", "z"]}), path)
    return path


def _corrupt_page_part(out: Path) -> Path:
    """Flip bytes inside one column's data page: the footer still reads."""
    path = part_files(out)[1]
    data = bytearray(path.read_bytes())
    col = next(
        pq.read_metadata(path).row_group(0).column(i)
        for i in range(pq.read_metadata(path).num_columns)
        if pq.read_metadata(path).row_group(0).column(i).path_in_schema == "start_ns"
    )
    for k in range(col.data_page_offset + 20, col.data_page_offset + col.total_compressed_size - 4):
        data[k] ^= 0x5A
    path.write_bytes(bytes(data))
    return path


def _with_column(out: Path, name: str, make, tag: str, **options) -> Path:
    good = pq.read_table(part_files(out)[0])
    bad = good.set_column(good.schema.get_field_index(name), name, make(good))
    path = out / "spans" / f"part-{tag}-000001.parquet"
    pq.write_table(bad, path, **options)
    return path


def _timestamp_part(out: Path) -> Path:
    return _with_column(out, "start_ns", lambda t: t["start_ns"].cast(pa.timestamp("ns")), "ts")


def _not_json_part(out: Path) -> Path:
    return _with_column(out, "attributes", lambda t: pa.array(["{nope"] * t.num_rows), "nojson")


def _null_part(out: Path) -> Path:
    """A NULL start time the footer's statistics count."""
    return _with_column(out, "start_ns", _one_null, "null")


def _null_no_stats_part(out: Path) -> Path:
    """A NULL start time and no statistics: only reading the rows finds it."""
    return _with_column(out, "start_ns", _one_null, "nullnostats", write_statistics=False)


def _one_null(t: pa.Table) -> pa.Array:
    return pa.array([None, *t["start_ns"].to_pylist()[1:]], pa.int64())


def _future_part(out: Path) -> Path:
    good = pq.read_table(part_files(out)[0])
    meta = {**(good.schema.metadata or {}), SCHEMA_VERSION_KEY: b"999"}
    path = out / "spans" / "part-future-000001.parquet"
    pq.write_table(good.replace_schema_metadata(meta), path)
    return path


SPOILS = [
    _wrong_type_part,
    _timestamp_part,
    _foreign_part,
    _corrupt_page_part,
    _not_json_part,
    _null_part,
    _null_no_stats_part,
    _future_part,
]


def _one_warning(err: str, bad: Path) -> None:
    warned = [line for line in err.splitlines() if bad.name in line]
    assert len(warned) == 1 and "skipping" in warned[0], err
    assert "Traceback" not in err


@pytest.mark.parametrize("spoil", SPOILS)
def test_every_command_skips_a_bad_part_with_one_warning(tmp_path, capsys, spoil) -> None:
    out = tmp_path / "t"
    _good_dir(out)
    bad = spoil(out)
    expected = 300 if spoil is _corrupt_page_part else 600

    # Attributes read as JSON: a part whose attributes are not JSON fails this query, and
    # the query is answered again with every row checked.
    sql = (
        "SELECT count(*) AS n, sum(end_ns - start_ns) >= 0 AS ok, "
        "count(json_extract(attributes, '$.x')) AS x FROM spans"
    )
    if spoil is not _null_no_stats_part:  # query checks no row it is not asked for
        assert main(["query", str(out), sql]) == 0
        captured = capsys.readouterr()
        assert str(expected) in captured.out and "true" in captured.out.lower()
        _one_warning(captured.err, bad)

    for fmt in ("jaeger-json", "chrome"):
        target = tmp_path / f"out-{fmt}.json"
        assert main(["export", str(out), "--format", fmt, "-o", str(target)]) == 0
        _one_warning(capsys.readouterr().err, bad)
        doc = json.loads(target.read_text())
        n = (
            sum(len(t["spans"]) for t in doc["data"])
            if fmt == "jaeger-json"
            else sum(1 for e in doc["traceEvents"] if e["ph"] == "X")
        )
        assert n == expected

    assert main(["report", str(out), "--json"]) == 0
    captured = capsys.readouterr()
    _one_warning(captured.err, bad)
    assert json.loads(captured.out)["metrics"]["spans"] == expected

    if spoil is not _not_json_part:  # the dashboard reads no attributes, live or --no-ui
        assert main(["view", str(out), "--no-ui"]) == 0
        _one_warning(capsys.readouterr().err, bad)

        feed = SpanFeed()
        DirSource(out).poll(feed)  # the viewer following the dir
        assert sum(b.num_rows for b in feed.drain()) == expected


def test_diff_skips_a_bad_part_on_either_side(tmp_path, capsys) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    _good_dir(a)
    _good_dir(b)
    bad = _null_no_stats_part(b)
    assert main(["diff", str(a), str(b)]) == 0
    _one_warning(capsys.readouterr().err, bad)


def test_only_future_parts_is_one_line(tmp_path, capsys) -> None:
    out = tmp_path / "t"
    _good_dir(out, parts=1, per=10)
    bad = _future_part(out)
    for p in part_files(out):
        if p != bad:
            p.unlink()
    assert main(["report", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "schema version 999 is newer" in err[0] and bad.name in err[0]


def test_stale_temps_go_and_a_live_writers_temp_stays(tmp_path) -> None:
    out = tmp_path / "t"
    _good_dir(out, parts=1, per=10)
    spans = out / "spans"
    # A writer that was killed: its pid is gone (a process that has exited).
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    dead_pid = int(dead.stdout)
    host = os.uname().nodename.replace("/", "_")
    killed = spans / f".part-{host}-{dead_pid}-abcdef-000003.parquet.0123abcd.tmp"
    killed.write_bytes(b"PAR1 half")
    live = spans / f".part-{host}-{os.getpid()}-abcdef-000004.parquet.4567abcd.tmp"
    live.write_bytes(b"PAR1 in flight")
    remote_fresh = spans / ".part-otherhost-123-abcdef-000001.parquet.89abcdef.tmp"
    remote_fresh.write_bytes(b"x")
    remote_old = spans / ".part-otherhost-124-abcdef-000001.parquet.89abcdee.tmp"
    remote_old.write_bytes(b"x")
    old = time.time() - 7200
    os.utime(remote_old, (old, old))

    chiptrace.connect(out)  # a reader opening the dir cleans up
    assert not killed.exists() and not remote_old.exists()
    assert live.exists() and remote_fresh.exists()
    assert remove_stale_temps(out) == []
