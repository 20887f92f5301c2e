from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pyarrow.parquet as pq
import pytest

import chiptrace
from chiptrace.cli import main
from chiptrace.schema import SCHEMA_VERSION_KEY, SPAN_SCHEMA
from chiptrace.store import check_part, part_files
from tests.waiting import wait_until


def _spans(n: int, name: str = "op") -> None:
    for _ in range(n):
        with chiptrace.span(name, chip="gpu:0"):
            pass


def test_flush_writes_complete_parts_with_schema_version(trace_dir):
    _spans(10)
    chiptrace.flush()
    _spans(5)
    chiptrace.flush()
    parts = part_files(trace_dir)
    assert len(parts) == 2
    assert not [p for p in (trace_dir / "spans").iterdir() if p.name.startswith(".")]
    meta = pq.read_schema(parts[0]).metadata
    assert meta[SCHEMA_VERSION_KEY] == b"1"
    assert pq.read_table(parts[0]).schema.equals(SPAN_SCHEMA, check_metadata=False)
    assert sum(pq.read_metadata(p).num_rows for p in parts) == 15
    host_pid = f"-{os.getpid()}-"
    assert all(host_pid in p.name for p in parts)  # per-process part names
    (manifest,) = (trace_dir / "manifest").glob("*.json")
    assert json.loads(manifest.read_text())["spans_written"] == 15


def test_truncated_part_is_skipped_with_warning(trace_dir, caplog, capsys):
    _spans(10, "good")
    chiptrace.flush()
    _spans(7, "doomed")
    chiptrace.flush()
    bad = part_files(trace_dir)[1]
    bad.write_bytes(bad.read_bytes()[:100])
    con = chiptrace.connect(trace_dir)
    assert con.sql("SELECT count(*) FROM spans").fetchall()[0][0] == 10
    assert bad.name in caplog.text
    rc = main(["query", str(trace_dir), "SELECT count(*) AS n FROM spans"])
    out, err = capsys.readouterr()
    assert rc == 0 and "10" in out
    assert f"skipping unreadable part {bad}" in err and len(err.strip().splitlines()) == 1


def test_newer_schema_version_is_a_clear_error(tmp_path, capsys):
    d = tmp_path / "future"
    (d / "spans").mkdir(parents=True)
    schema = SPAN_SCHEMA.with_metadata({SCHEMA_VERSION_KEY: b"99"})
    pq.write_table(schema.empty_table(), d / "spans" / "part-x.parquet")
    with pytest.raises(chiptrace.SchemaVersionError, match="schema version 99 is newer"):
        check_part(d / "spans" / "part-x.parquet")
    assert main(["query", str(d), "SELECT 1"]) == 2
    err = capsys.readouterr().err
    assert "schema version 99" in err and len(err.strip().splitlines()) == 1


def test_full_buffer_drops_and_counts(tmp_path):
    rec = chiptrace.init(tmp_path / "t", max_buffered=100, flush_interval_s=60, flush_spans=10**6)
    try:
        _spans(1000)
        assert rec.dropped == 900
        chiptrace.flush()
    finally:
        chiptrace.shutdown()
    con = chiptrace.connect(tmp_path / "t")
    assert con.sql("SELECT count(*) FROM spans").fetchall()[0][0] == 100
    assert con.sql("SELECT spans_dropped FROM runs").fetchall()[0][0] == 900


def test_failing_sink_never_reaches_the_program(tmp_path):
    class Broken:
        def write(self, batch):
            raise OSError("disk on fire")

        def close(self):
            raise OSError("still on fire")

    chiptrace.init(tmp_path / "t", sinks=[Broken()])
    _spans(3)
    assert chiptrace.flush() == 3
    rec = chiptrace.get_recorder()
    assert rec.sink_errors == 1 and rec.dropped == 0  # the store still got them
    chiptrace.shutdown()


_CHILD = textwrap.dedent(
    """
    import sys, time, chiptrace
    chiptrace.init(sys.argv[1], flush_interval_s=float(sys.argv[2]), flush_spans=500)
    print("ready", flush=True)
    i = 0
    while True:
        with chiptrace.span("work", chip="cpu:0"):
            i += 1
        if i % 100 == 0:
            time.sleep(0.001)
    """
)


def _start_child(out: Path, interval: float) -> subprocess.Popen:
    proc = subprocess.Popen(
        [sys.executable, "-c", _CHILD, str(out), str(interval)], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout.readline().strip() == "ready"
    return proc


def test_sigkill_mid_run_leaves_only_complete_parts(tmp_path):
    out = tmp_path / "killed"
    proc = _start_child(out, 0.05)
    wait_until(lambda: len(part_files(out)) >= 5, "five parts", timeout_s=60)
    proc.kill()
    proc.wait()
    parts = part_files(out)
    assert len(parts) >= 5
    assert all(check_part(p) is None for p in parts)
    con = chiptrace.connect(out)
    assert con.sql("SELECT count(*) FROM spans").fetchall()[0][0] >= 500


def test_sigterm_flushes_what_is_buffered(tmp_path):
    out = tmp_path / "termed"
    proc = _start_child(out, 3600)  # only size and exit flush
    # a size flush has landed, and the child is filling the next buffer
    wait_until(lambda: part_files(out), "a first part", timeout_s=60)
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=20)
    assert proc.returncode == -signal.SIGTERM
    con = chiptrace.connect(out)
    n = con.sql("SELECT count(*) FROM spans").fetchall()[0][0]
    written = con.sql("SELECT spans_written FROM runs").fetchall()[0][0]
    assert n > 0 and n == written
    assert n % 500 != 0 or n > 500  # the exit flush wrote a partial buffer, not only full ones


def test_two_processes_share_one_dir(tmp_path):
    out = tmp_path / "shared"
    code = "import sys, chiptrace\nchiptrace.init(sys.argv[1])\n" + "\n".join(
        ["for _ in range(50):", "    with chiptrace.span('p', chip='cpu:0'): pass"]
    )
    for _ in range(2):
        subprocess.run([sys.executable, "-c", code, str(out)], check=True)
    con = chiptrace.connect(out)
    assert con.sql("SELECT count(*), count(DISTINCT pid) FROM spans").fetchall()[0] == (100, 2)
    assert con.sql("SELECT count(*) FROM runs").fetchall()[0][0] == 2


def test_manifest_records_clock_offset(tmp_path):
    out = tmp_path / "clock"
    code = "import sys, chiptrace\nchiptrace.init(sys.argv[1])\nwith chiptrace.span('x'): pass"
    env = {**os.environ, "CHIPTRACE_CLOCK_OFFSET_NS": "-1234"}
    subprocess.run([sys.executable, "-c", code, str(out)], check=True, env=env)
    con = chiptrace.connect(out)
    row = con.sql("SELECT manifest->>'$.clock.offset_ns', host FROM runs").fetchall()[0]
    assert row[0] == "-1234" and row[1]
