"""The first frame of a stored trace dir: drawn from its newest part before the rest is
read, saying LOADING and how far its window reaches, with the loads the store's SQL gives
for that stretch; the whole window once every part is in. (The writer of these parts is
this process, alive, so the source stays LIVE rather than ENDED.)"""

from __future__ import annotations

import threading
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from viewer_helpers import screen_text, until
from viewer_rack import LOAD, STEP_NS, T0, sql_utilization, write_rack

from chiptrace.store import part_files
from chiptrace.viewer.app import ViewerApp
from chiptrace.viewer.sources import DirSource, SpanFeed

WINDOW_NS = 10 * STEP_NS  # the whole 1 s trace


class HeldDirSource(DirSource):
    """A DirSource that reads one part, then waits for the test's `go` before the next:
    the first frame stays on screen while the store is half read, however fast the box."""

    POLL_SPANS = 1  # one part a poll

    def __init__(self, directory: Path) -> None:
        super().__init__(directory)
        self.go = threading.Event()
        self.polls = 0

    def poll(self, feed: SpanFeed) -> None:
        if self.polls and not self.go.wait(timeout=120):
            return
        self.polls += 1
        super().poll(feed)


def _status(app: ViewerApp) -> str:
    return screen_text(app).splitlines()[2]  # under the header and the tabs


def _rows(path: Path) -> int:
    return pq.read_metadata(path).num_rows


async def test_first_frame_shows_the_newest_part_and_says_loading(tmp_path: Path) -> None:
    d = write_rack(tmp_path / "rack", steps=10, parts=2)  # steps 0-4, then 5-9
    old, new = part_files(d)
    src = HeldDirSource(d)
    app = ViewerApp([src], window_ns=WINDOW_NS, analysis_s=0)
    try:
        async with app.run_test(size=(100, 30)) as pilot:
            await until(pilot, lambda: "LOADING" in _status(app), "a first frame with data")
            snap = app.snapshot
            assert snap is not None and not snap.empty
            # The newest part was read first; the other is counted from its footer.
            assert (snap.spans_total, snap.unread) == (_rows(new), _rows(old))
            # The window starts where the unread part ends (step 4's end), and says so.
            assert snap.loading and snap.since_ns == T0 + 5 * STEP_NS
            status = _status(app)
            assert "500.0 ms of 1.00 s" in status and "read" in status
            expected = sql_utilization(d, snap.since_ns, snap.until_ns)
            shown = {r.id: r.utilization for rows in snap.chips.values() for r in rows}
            assert set(shown) == set(LOAD)
            for chip, u in shown.items():  # what SQL over the whole store says of that stretch
                assert u == pytest.approx(expected.get(chip, 0.0), abs=1e-6), chip
                assert u == pytest.approx(LOAD[chip], abs=1e-6), chip

            src.go.set()
            total = _rows(old) + _rows(new)

            def all_read() -> bool:
                s = app.snapshot
                return s is not None and s.spans_total == total and "LOADING" not in _status(app)

            await until(pilot, all_read, "every part read")
            snap = app.snapshot
            assert not snap.loading and snap.unread == 0
            assert (snap.since_ns, snap.until_ns) == (T0, T0 + WINDOW_NS)
            assert "1.00 s  " in _status(app)
            for rows in snap.chips.values():
                for r in rows:
                    assert r.utilization == pytest.approx(LOAD[r.id], abs=1e-6), r.id
    finally:
        src.go.set()
