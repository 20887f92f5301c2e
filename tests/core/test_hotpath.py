"""The hot path's structure (its speed is benchmarks/bench_hotpath.py's business): rows the
garbage collector never scans, no span objects kept, conversion in slices, the id layout,
the compiled wrapper's signature and its disabled path."""

from __future__ import annotations

import gc
import inspect
import json
import re
import threading
import weakref
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import chiptrace
from chiptrace.propagation import inject
from chiptrace.recording import fastrows as _fastrows
from chiptrace.recording import live as _live
from chiptrace.schema import NO_TAGS


@chiptrace.trace(chip="gpu:0")
def leaf(x: int) -> int:
    return x + 1


@chiptrace.trace
def root(n: int) -> int:
    return sum(leaf(i) for i in range(n))


def _rows(directory: Path) -> list[dict]:
    chiptrace.flush()
    con = chiptrace.connect(directory)
    return con.sql("SELECT * FROM spans ORDER BY start_ns").to_arrow_table().to_pylist()


def test_buffered_rows_are_untracked_int_tuples(trace_dir: Path) -> None:
    rec = chiptrace.get_recorder()
    root(3000)
    gc.collect()  # a collection untracks tuples of atomic values, then tuples of those
    gc.collect()
    chunks = rec.chunks()
    assert len(chunks) >= 2 and all(len(c) == rec.chunk_rows for c in chunks)
    assert not any(gc.is_tracked(c) for c in chunks)
    assert not any(gc.is_tracked(r) for c in chunks for r in c)
    assert all(type(v) is int for c in chunks for r in c for v in r)


def test_no_span_object_outlives_its_span(trace_dir: Path) -> None:
    with chiptrace.span("block", attributes={"k": 1}) as s:
        leaf(1)
    ref = weakref.ref(s)
    del s
    assert ref() is None  # the row holds values, not the span
    assert not _live._EXTRA


def test_general_rows_convert_in_pieces_with_pauses_between(trace_dir: Path) -> None:
    pauses = []
    conv = _fastrows.Converter(chiptrace.get_recorder().constants, lambda: pauses.append(1))
    general = [
        (NO_TAGS, 1, 1, i + 1, 0, 10, 20, "g", 1, 0, None, {"i": i}, None, None)
        for i in range(1024)
    ]
    conv.add(tuple(general))
    batches = conv.finish()
    assert [b.num_rows for b in batches] == [_fastrows.RICH_SLICE] * (1024 // 256)
    assert len(pauses) == len(batches) - 1 and not conv.bad


def test_writer_thread_converts_everything_in_slices(tmp_path: Path) -> None:
    out = tmp_path / "t"
    rec = chiptrace.init(out, flush_interval_s=0.05)
    try:
        root(5000)
        with chiptrace.span("tagged", chip="cpu:0", attributes={"op.bytes": 7}):
            pass
        deadline = threading.Event()
        for _ in range(200):
            if rec.spans_flushed >= 5002:
                break
            deadline.wait(0.05)
    finally:
        chiptrace.shutdown()
    con = chiptrace.connect(out)
    counts = dict(con.sql("SELECT name, count(*) FROM spans GROUP BY name").fetchall())
    assert counts == {"root": 1, "leaf": 5000, "tagged": 1}
    leaves = con.sql("SELECT DISTINCT chip_id, op_kind FROM spans WHERE name='leaf'").fetchall()
    assert leaves == [("gpu:0", "compute")]
    assert con.sql("SELECT op_bytes FROM spans WHERE name='tagged'").fetchall() == [(7,)]


def test_trace_id_is_process_half_and_root_span_id(trace_dir: Path) -> None:
    seen: list[str] = []

    @chiptrace.trace
    def capture() -> None:
        seen.append(inject({})["traceparent"])

    capture()
    capture()
    root(2)
    for header in seen:
        assert re.fullmatch(r"00-[0-9a-f]{32}-[0-9a-f]{16}-01", header)
    rows = _rows(trace_dir)
    roots = [r for r in rows if r["parent_span_id"] is None]
    assert len(roots) == 3
    # Ids read back as hex: the high half is the process's, the low half the root's id.
    assert len({r["trace_id"][:16] for r in roots}) == 1
    for r in roots:
        assert r["trace_id"][16:] == r["span_id"] and int(r["trace_id"], 16) != 0
    ids = [r["span_id"] for r in rows]
    assert len(set(ids)) == len(ids) and "0" * 16 not in ids
    by_id = {r["span_id"]: r for r in rows}
    for r in rows:
        if r["parent_span_id"] is not None:
            assert by_id[r["parent_span_id"]]["trace_id"] == r["trace_id"]


def test_writes_to_a_decorated_calls_span_and_its_exception(trace_dir: Path) -> None:
    @chiptrace.trace(op="io", name="annotated")
    def annotated() -> None:
        chiptrace.current_span().set_attribute("rows", 3)
        chiptrace.current_span().add_event("halfway")

    @chiptrace.trace(name="failing")
    def failing() -> None:
        raise KeyError("x")

    annotated()
    with pytest.raises(KeyError):
        failing()
    assert not _live._EXTRA
    rows = {r["name"]: r for r in _rows(trace_dir)}
    assert rows["annotated"]["attributes"] == '{"rows":3}'
    assert "halfway" in rows["annotated"]["events"] and rows["annotated"]["op_kind"] == "io"
    assert rows["failing"]["status_code"] == 2 and "KeyError" in rows["failing"]["events"]


def test_wrapper_keeps_the_signature_and_the_calling_conventions(trace_dir: Path) -> None:
    def original(a, /, b, c=3, *args, d, e=5, **kw):  # noqa: ANN001, ANN002, ANN003, ANN202
        return (a, b, c, args, d, e, kw)

    traced = chiptrace.trace(original)
    assert inspect.signature(traced) == inspect.signature(original)
    assert traced(1, 2, d=4) == original(1, 2, d=4)
    assert traced(1, b=2, c=9, d=4, z=0) == original(1, b=2, c=9, d=4, z=0)
    assert traced(1, 2, 3, 4, 5, d=6, e=7) == original(1, 2, 3, 4, 5, d=6, e=7)
    with pytest.raises(TypeError):
        traced(a=1, b=2, d=4)  # positional-only stays positional-only

    class Thing:
        @chiptrace.trace
        def method(self, fn, now=1):  # noqa: ANN001, ANN201 - names the wrapper uses inside
            return (fn, now)

    assert Thing().method(2) == (2, 1)


def test_disabled_at_run_time_returns_the_result_and_records_nothing(tmp_path: Path) -> None:
    assert chiptrace.init(tmp_path / "off", enabled=False) is None
    try:
        assert root(3) == 6
        with chiptrace.span("nothing"):
            assert leaf(1) == 2
    finally:
        chiptrace.shutdown()
        chiptrace.init(tmp_path / "on")  # enabled again for the tests after this one
        chiptrace.shutdown()
    assert not (tmp_path / "off").exists() or not list((tmp_path / "off").rglob("*.parquet"))


def test_a_decorated_calls_span_shows_its_start_and_ids(trace_dir: Path) -> None:
    seen = []

    @chiptrace.trace(name="probe")
    def probe() -> None:
        s = chiptrace.current_span()
        seen.append((s.get_span_context(), s.start_ns, s.is_recording()))

    probe()
    ctx, start, recording = seen[0]
    (row,) = [r for r in _rows(trace_dir) if r["name"] == "probe"]
    assert ctx.is_valid and recording and start == row["start_ns"]
    assert f"{ctx.span_id:016x}" == row["span_id"] and f"{ctx.trace_id:032x}" == row["trace_id"]


def test_span_attributes_ride_a_site_row_checked_where_they_must_be(trace_dir: Path) -> None:
    """`span(..., attributes=...)` buffers a site row and its dict (converted a slice at a
    time, like a plain row); typed keys, static attributes and values JSON cannot take
    still get the per-span checks of a general row."""
    rec = chiptrace.get_recorder()

    @chiptrace.trace(name="decorated", attributes={"static": 1})
    def decorated() -> None:
        chiptrace.current_span().set_attribute("dynamic", 2)

    with chiptrace.span("plain", attributes={"step": 3, "phase": "fwd"}):
        pass
    with chiptrace.span("typed", chip="gpu:1", attributes={"op.bytes": 7, "k": "v"}):
        pass
    with chiptrace.span("empty", attributes={}):
        pass
    with chiptrace.span("bad", attributes={(1, 2): 3}):  # a key JSON cannot take
        pass
    decorated()
    assert [len(r) for r in rec.cur[:4]] == [11, 11, 7, 9]  # flat: keys, values; {}: none
    gc.collect()  # flat rows of atomic values: the collector stops tracking them at once
    assert not any(gc.is_tracked(r) for r in rec.cur[:4])
    got = {r["name"]: r for r in _rows(trace_dir)}
    for r in got.values():
        r["attributes"] = json.loads(r["attributes"]) if r["attributes"] else None
    assert got["plain"]["attributes"] == {"step": 3, "phase": "fwd"}
    assert got["typed"]["op_bytes"] == 7 and got["typed"]["chip_id"] == "gpu:1"
    assert got["typed"]["attributes"] == {"k": "v"}
    assert got["empty"]["attributes"] is None
    assert got["decorated"]["attributes"] == {"static": 1, "dynamic": 2}
    assert "bad" not in got and rec.spans_rejected == 1


@pytest.mark.parametrize("pairs", [[("a", 1)], [("a", 1), ("b", "x")], None])
def test_site_rows_attributes_read_back_whatever_their_lengths(pairs: list | None) -> None:
    from chiptrace.recording.fastrows import _all_attributes, site_row_attributes

    one = [(1, 2, 3, i, 5, 6, 7, "a", i) for i in range(3)]
    flat = (*(k for k, _ in pairs or ()), *(v for _, v in pairs or ()))  # keys, then values
    rows = one if pairs is None else [(1, 2, 3, i, 5, 6, 7, *flat) for i in range(3)]
    if pairs is None:  # mixed lengths: one attribute and two
        rows = one + [(1, 2, 3, 9, 5, 6, 7, "a", "b", 1, 2)]
    assert _all_attributes(rows) == [site_row_attributes(r) for r in rows]
    want = {"a": 1, "b": 2} if pairs is None else dict(pairs)
    assert _all_attributes(rows)[-1] == want


_VALUES = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70),
    st.text(max_size=12),
    st.booleans(),
    st.floats(allow_nan=True, allow_infinity=True),
    st.none(),
    st.lists(st.integers(), max_size=2),
)


@settings(max_examples=300, deadline=None)
@given(
    keys=st.lists(st.text(min_size=1, max_size=6), min_size=1, max_size=3, unique=True),
    data=st.data(),
)
def test_site_rows_json_by_column_is_dumps_exactly(keys: list[str], data: st.DataObject) -> None:
    """The column-at-a-time JSON of site rows is vocab.dumps' text for every row, whatever
    the values (a column of mixed or odd types takes the general path)."""
    from chiptrace.recording.fastrows import _attributes_json
    from chiptrace.vocab import dumps

    n = data.draw(st.integers(min_value=1, max_value=5))
    rows = []
    for i in range(n):
        values = [data.draw(_VALUES) for _ in keys]
        rows.append((1, 2, 3, i, 5, 6, 7, *keys, *values))
    text, general = _attributes_json(rows)
    expected = [dumps(dict(zip(keys, r[7 + len(keys) :]))) for r in rows]
    assert [t for i, t in enumerate(text) if i not in general] == [
        e for i, e in enumerate(expected) if i not in general
    ]
