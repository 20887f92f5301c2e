"""The live model while a store is read newest part first: a snapshot counts only the time
after the spans not read yet, and says so; a manifest declared again does not grow it."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest
from viewer_rack import LOAD, STEP_NS, T0, TOPOLOGY, step_batch, write_rack

from chiptrace.store import part_files
from chiptrace.viewer.alerts import derive_alerts
from chiptrace.viewer.live_model import INGEST_COLUMNS, LiveModel
from chiptrace.viewer.sources import DirSource, SpanFeed

BUCKET_NS = 10_000_000


def test_dir_source_reads_newest_first_and_counts_the_rest(tmp_path: Path) -> None:
    d = write_rack(tmp_path / "rack", steps=9, parts=3)  # steps 0-2, 3-5, 6-8
    src, feed = DirSource(d), SpanFeed()
    src.POLL_SPANS = 1  # one part a poll
    parts = part_files(d)
    rows = [pq.read_metadata(p).num_rows for p in parts]
    backlogs, read = [], []
    for _ in parts:
        src.poll(feed)
        batches = feed.drain()
        read.append(sum(b.num_rows for b in batches))
        assert all(b.schema.names == INGEST_COLUMNS for b in batches)
        backlogs.append(src.backlog())
    assert read == rows[::-1]
    # After each poll: the unread parts reach to the end of the newest of them.
    assert backlogs == [
        (T0 + 6 * STEP_NS, rows[0] + rows[1]),
        (T0 + 3 * STEP_NS, rows[0]),
        (None, 0),
    ]


def test_a_snapshot_starts_after_the_unread_spans() -> None:
    model = LiveModel(bucket_ns=BUCKET_NS)
    model.declare([{"topology": TOPOLOGY}])
    newest = step_batch(9, 0)  # the last 100 ms of a 1 s trace
    older = step_batch(8, newest.num_rows)
    window = 5 * STEP_NS

    # Nothing of the window complete yet: no figure at all (not 0%), no alert.
    model.ingest_all([newest], (T0 + 10 * STEP_NS, 1000))
    snap = model.snapshot(window)
    assert snap.empty and not snap.covered and snap.unread == 1000
    assert derive_alerts(snap) == []

    # The unread spans end where step 9 starts: the window shows step 9 only, saying so.
    model.ingest_all([], (T0 + 9 * STEP_NS, 1000))
    snap = model.snapshot(window)
    assert not snap.empty and snap.loading
    assert (snap.since_ns, snap.until_ns) == (T0 + 9 * STEP_NS, T0 + 10 * STEP_NS)
    shown = {r.id: r.utilization for rows in snap.chips.values() for r in rows}
    assert shown == pytest.approx(LOAD, abs=1e-6)

    # Everything read: the window reaches back to the first span read.
    model.ingest_all([older], (None, 0))
    snap = model.snapshot(window)
    assert not snap.loading and snap.unread == 0
    assert snap.since_ns == T0 + 8 * STEP_NS


def test_declaring_a_manifest_again_does_not_grow_the_rings() -> None:
    model = LiveModel(bucket_ns=BUCKET_NS)
    manifest = {"topology": TOPOLOGY}
    model.declare([manifest])
    shapes = (model.chips.busy.shape, model.links.busy.shape)
    model.declare([manifest])
    assert (model.chips.busy.shape, model.links.busy.shape) == shapes
    assert len(model.chips.meta) == len(LOAD)
