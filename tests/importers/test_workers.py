"""Kineto blocks mapped by worker processes give the spans mapping in place gives.

The imports run as `chiptrace import` processes: workers are forked only from a process
with no other thread, which a test session is not. The trace is a real fixture's events
repeated over several 2 MiB blocks; in the tricky one, an event name full of `}, {`
straddles the end of the first block, so the cut there falls inside a string: the
worker's decode of that block fails and the stream takes it (and every later block) back
to decode in place.
"""

from __future__ import annotations

import json
import subprocess
import sys

import msgspec
import pytest

import chiptrace
from chiptrace.importers import events as ev
from chiptrace.importers.source import BLOCK_BYTES, TraceEventStream
from tests.importers.conftest import load_events

TRICKY = "}, {" * 100


def _trace(path, tricky: bool) -> int:
    """simple_add's events repeated to ~5 MB; returns how many events. The first block ends
    BLOCK_BYTES after the array's start: the tricky trace has an event whose name (padding,
    then TRICKY) holds that point, 50 bytes into TRICKY."""
    doc = load_events("simple_add.json.gz")
    events = doc.pop("traceEvents")
    span = max(e.get("ts", 0) + e.get("dur", 0) for e in events)
    base = next(e for e in events if e.get("ph") == "X")
    head = json.dumps(doc)[:-1] + ', "traceEvents": ['
    texts: list[str] = []
    at, copy = 0, 0  # bytes of events written, from the array's start
    while at < 5 << 20:
        for e in events:
            if tricky and at > BLOCK_BYTES - 5000:
                into = json.dumps(dict(base, name=TRICKY)).index(TRICKY)
                pad = "x" * (BLOCK_BYTES - 50 - at - into)
                texts.append(json.dumps(dict(base, name=pad + TRICKY)))
                at += len(texts[-1]) + 2
                tricky = False
            texts.append(json.dumps(dict(e, ts=round(e.get("ts", 0) + copy * span, 3))))
            at += len(texts[-1].encode()) + 2
        copy += 1
    path.write_text(head + ", ".join(texts) + "]}")
    return len(texts)


def test_a_block_cut_inside_a_string_is_read_again(tmp_path):
    trace = tmp_path / "trace.json"
    n = _trace(trace, tricky=True)
    stream = TraceEventStream(trace, ev.Event)
    stream.in_main = False
    decoder = msgspec.json.Decoder(list[ev.Event])
    names, out, back = [], [], 0
    for item in stream.blocks():
        if isinstance(item, bytes):
            out.append(item)
            continue
        for raw in out:  # the barrier, or events decoded in place: settle what is out
            try:
                names += [e.name for e in decoder.decode(raw)]
            except msgspec.DecodeError:
                stream.pushback(out[out.index(raw) :])
                back += 1
                break
        out = []
        names += [e.name for e in item or []]
    assert back == 1
    assert len(names) == n
    assert sum(TRICKY in x for x in names) == 1


def _import(trace, out, workers: int) -> dict:
    r = subprocess.run(
        [sys.executable, "-m", "chiptrace", "import", str(trace), "--out", str(out)]
        + ["--workers", str(workers), "--json"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout)


def _spans(out) -> list[tuple]:
    con = chiptrace.connect(out)
    return con.execute(
        "SELECT s.name, s.start_ns, s.end_ns, s.chip_id, s.op_kind, s.op_bytes, s.attributes, "
        "p.name, p.start_ns, l.name, l.start_ns FROM spans s "
        "LEFT JOIN spans p ON p.span_id = s.parent_span_id "
        "LEFT JOIN spans l ON l.span_id = s.links->>'$[0].span_id' ORDER BY ALL"
    ).fetchall()


@pytest.mark.parametrize("tricky", [False, True], ids=["plain", "cut-inside-a-string"])
def test_workers_map_blocks_as_the_main_process_does(tmp_path, tricky):
    trace = tmp_path / "trace.json"
    events = _trace(trace, tricky)
    here = _import(trace, tmp_path / "here", 0)
    there = _import(trace, tmp_path / "there", 2)
    assert (here["workers"], there["workers"]) == (0, 2)
    assert here["files"][0]["events"] == there["files"][0]["events"] == events
    assert here["spans"] == there["spans"] > 0
    assert _spans(tmp_path / "here") == _spans(tmp_path / "there")
