"""Chrome async events (`b`/`e` nestable, `S`/`T`/`p`/`F` legacy) are stored as spans, paired
and nested the way Perfetto's JSON importer pairs them (catapult's for the legacy kind)."""

from __future__ import annotations

import json

import chiptrace


def _import(tmp_path, events):
    path = tmp_path / "trace.json"
    path.write_text(json.dumps({"traceEvents": events}))
    out = tmp_path / "out"
    summary = chiptrace.import_trace(path, out)
    con = chiptrace.connect(out)
    rows = con.execute(
        "SELECT s.name, s.start_ns // 1000, (s.end_ns - s.start_ns) // 1000, p.name, "
        "json_extract_string(s.attributes, '$.\"chrome.async_id\"') "
        "FROM spans s LEFT JOIN spans p ON s.parent_span_id = p.span_id ORDER BY 2, 1"
    ).fetchall()
    return summary, rows


def _ev(ph, name, ts, cat="c", pid=1, tid=1, **kw):
    return {"ph": ph, "name": name, "cat": cat, "ts": ts, "pid": pid, "tid": tid, **kw}


def test_nestable_async_pairs_by_track_and_nests_under_the_open_begin(tmp_path):
    events = [
        _ev("b", "req", 0, id="0x1"),
        _ev("b", "req", 5, id="0x2"),  # another id: another track, no parent
        _ev("b", "inner", 10, id="0x1", tid=7),  # written by another thread: same track
        _ev("e", "req", 15, id="0x2"),
        _ev("e", "inner", 20, id="0x1"),
        _ev("e", "nothing-open", 25, id="0x1"),  # ends no span: counted
        _ev("e", "req", 30, id="0x1", args={"code": 200}),
        _ev("X", "sync", 1, dur=40),  # the thread's own work is no parent of async spans
    ]
    summary, rows = _import(tmp_path, events)
    assert rows == [
        ("req", 0, 30, None, "0x1"),
        ("sync", 1, 40, None, None),
        ("req", 5, 10, None, "0x2"),
        ("inner", 10, 10, "req", "0x1"),
    ]
    assert summary.files[0]["skipped"] == {"e without b": 1}
    code = (
        chiptrace.connect(tmp_path / "out")
        .execute("SELECT attributes->>'$.code' FROM spans WHERE start_ns = 0")
        .fetchone()[0]
    )
    assert code == "200"  # an end's args are the span's too, as Perfetto adds them


def test_an_end_closes_the_innermost_open_begin_of_its_name(tmp_path):
    """Perfetto's SliceTracker::End: `e outer` while `inner` is open ends `outer`; `inner`
    stays open, and at the end of the input it ends at the last timestamp, with a warning."""
    events = [
        _ev("b", "outer", 0, id=1),
        _ev("b", "inner", 10, id=1),
        _ev("b", "inner", 12, id=1),
        _ev("e", "inner", 14, id=1),  # the innermost `inner` (12)
        _ev("e", "outer", 20, id=1),
        _ev("X", "later", 50, dur=10),  # the file's last timestamp: 60
    ]
    summary, rows = _import(tmp_path, events)
    assert ("outer", 0, 20, None, "1") in rows
    assert ("inner", 12, 2, "inner", "1") in rows
    assert ("inner", 10, 50, None, "1") in rows  # outlived its parent: a root on the track
    assert any("1 async spans never ended" in w for w in summary.files[0]["warnings"])


def test_id2_local_is_per_process_and_global_is_not(tmp_path):
    events = [
        _ev("b", "a", 0, pid=1, id2={"local": "0x5"}),
        _ev("b", "a", 1, pid=2, id2={"local": "0x5"}),  # same local id, other process
        _ev("e", "a", 2, pid=2, id2={"local": "0x5"}),
        _ev("e", "a", 3, pid=1, id2={"local": "0x5"}),
        _ev("b", "g", 10, pid=1, id2={"global": "0x9"}),
        _ev("e", "g", 14, pid=2, id2={"global": "0x9"}),  # ends in another process
        _ev("b", "no-id", 20),
    ]
    summary, rows = _import(tmp_path, events)
    assert rows == [("a", 0, 3, None, "0x5"), ("a", 1, 1, None, "0x5"), ("g", 10, 4, None, "0x9")]
    assert summary.files[0]["skipped"] == {"ph=b without id": 1}


def test_legacy_async_pairs_by_name_and_its_steps_are_children(tmp_path):
    events = [
        _ev("S", "load", 0, id="7", args={"url": "x"}),
        _ev("S", "other", 5, id="7"),  # same id, another name: its own span
        _ev("T", "load", 10, id="7", args={"step": "parse"}),
        _ev("p", "other", 8, id="7", args={"step": "queued"}),
        _ev("T", "load", 20, id="7", args={"step": "paint"}),
        _ev("F", "load", 30, id="7"),
        _ev("F", "other", 12, id="7"),
        _ev("F", "stray", 40, id="7"),  # no S: counted
    ]
    summary, rows = _import(tmp_path, events)
    assert rows == [
        ("load", 0, 30, None, "7"),
        ("other", 5, 7, None, "7"),
        ("other:queued", 5, 3, "other", "7"),
        ("load:parse", 10, 10, "load", "7"),
        ("load:paint", 20, 10, "load", "7"),
    ]
    assert summary.files[0]["skipped"] == {"F without S": 1}


def test_async_pairs_across_blocks_of_a_large_file(tmp_path):
    """Begins and ends far apart in the file (other blocks between them) still pair."""
    filler = [_ev("X", f"x{i}", i, dur=1, args={"pad": "p" * 200}) for i in range(20_000)]
    events = [_ev("b", "long", 0, id="0xa"), *filler, _ev("e", "long", 30_000, id="0xa")]
    summary, rows = _import(tmp_path, events)
    assert summary.spans == 20_001
    assert ("long", 0, 30_000, None, "0xa") in rows
    assert not summary.files[0].get("warnings")


def test_an_end_written_before_its_begin_still_pairs(tmp_path):
    """Chrome writes each thread's buffer in turn: an end may come first in the file."""
    events = [
        _ev("e", "req", 30, id="0x1", tid=2),
        _ev("F", "load", 20, id="7", tid=2),
        _ev("b", "req", 0, id="0x1"),
        _ev("S", "load", 5, id="7"),
        _ev("F", "state", 3, id="7"),  # a state begun before tracing began: ends nothing
        _ev("S", "state", 4, id="7"),  # begun after it: never ends
        _ev("X", "x", 0, dur=50),
    ]
    summary, rows = _import(tmp_path, events)
    assert rows == [
        ("req", 0, 30, None, "0x1"),
        ("x", 0, 50, None, None),
        ("state", 4, 46, None, "7"),
        ("load", 5, 15, None, "7"),
    ]
    assert summary.files[0]["skipped"] == {"F without S": 1}
    assert any("1 async spans never ended" in w for w in summary.files[0]["warnings"])


def test_a_slice_that_never_ended_ends_at_the_last_timestamp_like_perfetto(tmp_path):
    """A `B` with no `E` is kept (Perfetto draws it to the trace's end, "Did not end"), its
    children still nested under it; a stray `E` is counted."""
    events = [
        _ev("B", "step", 0),
        _ev("B", "fwd", 5),
        _ev("E", "fwd", 9),
        _ev("X", "kernel", 10, dur=4),
        _ev("E", "stray", 3, tid=2),  # ends nothing on its thread
        _ev("X", "later", 50, dur=10, tid=3),  # the file's last timestamp: 60
    ]
    summary, rows = _import(tmp_path, events)
    assert ("step", 0, 60, None, None) in rows
    assert ("fwd", 5, 4, "step", None) in rows
    assert ("kernel", 10, 4, "step", None) in rows
    assert any("1 slices never ended (B without E)" in w for w in summary.files[0]["warnings"])
    assert summary.files[0]["skipped"] == {"E without B": 1}
