"""The in-process recorder under abuse: signals during a flush, bad values, writes after
end(), repeated init(), concurrent manifest writers, @trace on a class."""

from __future__ import annotations

import gc
import json
import logging
import signal
import subprocess
import sys
import textwrap
import threading
import weakref
from pathlib import Path

import pytest
from opentelemetry.trace import StatusCode

import chiptrace
from chiptrace.schema import empty_batch
from chiptrace.store import PartWriter, part_files, read_manifests
from tests.waiting import wait_until

# The main thread is inside flush() nearly all the time (the sink is slow and holds the
# flush lock), so a SIGTERM handler that flushed would wait on that lock forever.
_FLUSHING_CHILD = textwrap.dedent(
    """
    import sys, time, chiptrace

    class Slow:
        def write(self, batch):
            time.sleep(0.02)
        def close(self):
            pass

    chiptrace.init(sys.argv[1], sinks=[Slow()], flush_interval_s=3600)
    print("ready", flush=True)
    while True:
        for _ in range(20):
            with chiptrace.span("work", chip="cpu:0"):
                pass
        chiptrace.flush()
    """
)


def test_sigterm_while_the_main_thread_flushes_never_hangs(tmp_path: Path) -> None:
    procs = []
    for i in range(3):
        out = tmp_path / f"t{i}"
        p = subprocess.Popen(
            [sys.executable, "-c", _FLUSHING_CHILD, str(out)], stdout=subprocess.PIPE, text=True
        )
        assert p.stdout.readline().strip() == "ready"
        procs.append((p, out))
    for p, out in procs:
        wait_until(lambda out=out: len(part_files(out)) >= 2, "two parts")
        p.send_signal(signal.SIGTERM)
    for p, out in procs:
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()
            pytest.fail("SIGTERM during flush() hung the process")
        assert p.returncode == -signal.SIGTERM
        con = chiptrace.connect(out)
        n = con.sql("SELECT count(*) FROM spans").fetchall()[0][0]
        (m,) = read_manifests([out])
        assert n > 0 and m["spans_written"] == n and m.get("ended_unix_ns")


@pytest.mark.parametrize(
    ("spoil", "needle"),
    [
        (lambda s: s.set_attribute("op.bytes", "4 MiB"), "op.bytes='4 MiB'"),
        (lambda s: s.set_attribute("op.flops", 2**70), "op.flops="),
        (lambda s: s.set_attribute("chip.id", 3), "chip.id=3"),
        (lambda s: s.update_name(42), "name=42: expected a string"),
        (lambda s: s.set_attributes({("a", "b"): 1}), "attributes:"),
        (lambda s: s.end("tomorrow"), "end_time='tomorrow': expected integer Unix ns"),
    ],
)
def test_one_bad_value_drops_one_span_and_counts_it(tmp_path, caplog, spoil, needle) -> None:
    out = tmp_path / "t"
    rec = chiptrace.init(out, flush_interval_s=3600, flush_spans=10**6)
    try:
        for i in range(1000):
            with chiptrace.span("op", chip="gpu:0") as s:
                s.set_attribute("op.bytes", i)
                if i == 500:
                    spoil(s)
        with caplog.at_level(logging.WARNING, logger="chiptrace"):
            assert chiptrace.flush() == 999
        assert rec.dropped == 1 and rec.spans_rejected == 1
    finally:
        chiptrace.shutdown()
    assert needle in caplog.text and caplog.text.count("bad value") == 1
    con = chiptrace.connect(out)
    assert con.sql("SELECT count(*), sum(op_bytes) FROM spans").fetchall()[0] == (
        999,
        sum(range(1000)) - 500,
    )
    (m,) = read_manifests([out])
    assert m["spans_written"] == 999 and m["spans_dropped"] == 1 and m["spans_rejected"] == 1


def test_chip_id_set_on_the_span_brings_its_type(trace_dir: Path) -> None:
    with chiptrace.span("x", chip="gpu:0") as s:
        s.set_attribute("chip.id", "npu:2")
    chiptrace.flush()
    con = chiptrace.connect(trace_dir)
    assert con.sql("SELECT chip_id, chip_type FROM spans").fetchall() == [("npu:2", "npu")]


def test_an_ended_span_is_read_only_with_one_warning(trace_dir: Path, caplog, monkeypatch) -> None:
    monkeypatch.setattr(chiptrace.recording.spans, "_warned_ended", False)  # once per process
    with chiptrace.span("done") as s:
        s.set_attribute("kept", 1)
    with caplog.at_level(logging.WARNING, logger="chiptrace"):
        s.set_attribute("late", 2)
        s.set_attributes({"later": 3})
        s.add_event("late event")
        s.update_name("renamed")
        s.set_status(StatusCode.ERROR, "late")
    chiptrace.flush()
    con = chiptrace.connect(trace_dir)
    row = con.sql("SELECT name, attributes, events, status_code FROM spans").fetchall()
    assert row == [("done", '{"kept":1}', None, 0)]
    warnings = [r for r in caplog.records if "ended span" in r.getMessage()]
    assert len(warnings) == 1 and "set_attribute" in warnings[0].getMessage()


def test_init_again_releases_the_previous_recorder(tmp_path: Path) -> None:
    threads_before = threading.active_count()
    refs = []
    for i in range(20):
        rec = chiptrace.init(tmp_path / f"t{i}", flush_interval_s=3600)
        refs.append(weakref.ref(rec))
        with chiptrace.span("one"):
            pass
    del rec
    try:
        gc.collect()
        alive = [r for r in refs if r() is not None]
        assert alive == [refs[-1]]
        assert threading.active_count() <= threads_before + 2  # the live writer (+ watcher)
        for i in range(19):  # each replaced recorder flushed on its way out
            (m,) = read_manifests([tmp_path / f"t{i}"])
            assert m["spans_written"] == 1 and m.get("ended_unix_ns")
    finally:
        chiptrace.shutdown()
    gc.collect()
    assert refs[-1]() is None


def test_concurrent_parts_and_manifest_updates_stay_consistent(tmp_path: Path) -> None:
    w = PartWriter(tmp_path / "t")
    batch = empty_batch()
    errors: list[BaseException] = []

    def parts() -> None:
        try:
            for _ in range(30):
                w.write(batch)
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    def manifests(k: int) -> None:
        try:
            for i in range(30):
                w.write_manifest(**{f"k{k}_{i}": i})
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    ts = [threading.Thread(target=parts) for _ in range(2)]
    ts += [threading.Thread(target=manifests, args=(k,)) for k in range(2)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors
    w.write_manifest()
    m = json.loads(next((tmp_path / "t" / "manifest").glob("*.json")).read_text())
    assert m["parts_written"] == 60 == len(part_files(tmp_path / "t"))
    assert all(m[f"k{k}_29"] == 29 for k in range(2))


def test_trace_on_a_class_is_a_one_line_type_error() -> None:
    with pytest.raises(TypeError, match="cannot decorate class Model") as e:

        @chiptrace.trace
        class Model:
            pass

    assert "\n" not in str(e.value)
    with pytest.raises(TypeError, match="expects a function"):
        chiptrace.trace("a name")


def test_a_flush_of_many_batches_is_one_row_group_with_dictionary_pages(tmp_path: Path) -> None:
    """The flush hands the store its batches as chunks (not combined first): the part is
    still one row group, its names dictionary-encoded, every span in it."""
    import pyarrow.parquet as pq

    rec = chiptrace.init(tmp_path / "t", flush_interval_s=3600, flush_spans=10**9)

    @chiptrace.trace(chip="gpu:0")
    def op() -> None:
        pass

    for i in range(20_000):  # ~5 batches of 4,096 plain rows, and site rows beside them
        op()
        if i % 7 == 0:
            with chiptrace.span("step", attributes={"i": i}):
                pass
    assert rec.flush() == 20_000 + 20_000 // 7 + 1
    (part,) = part_files(tmp_path / "t")
    meta = pq.ParquetFile(part).metadata
    assert meta.num_row_groups == 1 and meta.num_rows == 20_000 + 20_000 // 7 + 1
    name = meta.row_group(0).column(meta.schema.to_arrow_schema().names.index("name"))
    assert "RLE_DICTIONARY" in name.encodings
    chiptrace.shutdown()
