"""Building a viewer for a source: the glue `chiptrace view` and `chiptrace demo` share.

Also the text summary (`--no-ui`, or stdout not a terminal): the same snapshot and alerts
the dashboard draws, printed once.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from chiptrace.schema import CHIP_TYPES
from chiptrace.store import usable_parts
from chiptrace.viewer.alerts import Alert, derive_alerts
from chiptrace.viewer.live_model import DEFAULT_BUCKET_NS, INGEST_COLUMNS, LiveModel, Snapshot
from chiptrace.viewer.render import human_bytes_per_s, human_count, human_ns
from chiptrace.viewer.sources import DirSource, SpanFeed, read_part

MIN_BUCKET_NS = 1_000


def choose_bucket(extent_ns: int | None) -> tuple[int, int | None]:
    """(bucket_ns, window_ns) for a trace of this length: a long trace gets the default
    10 ms buckets; a short finished one finer buckets, so it fills the history."""
    if not extent_ns or extent_ns <= 0:
        return DEFAULT_BUCKET_NS, None
    bucket = int(min(DEFAULT_BUCKET_NS, max(MIN_BUCKET_NS, extent_ns // 2000)))
    return bucket, max(bucket, extent_ns // 20)


def dir_app(
    directory: str | Path,
    replay: float | None = None,
    window_ns: int | None = None,
    bucket_ns: int | None = None,
):  # noqa: ANN201 - imports Textual lazily
    """A ViewerApp following (or replaying) a trace dir."""
    from chiptrace.viewer.app import ViewerApp

    src = DirSource(directory, replay=replay)
    # The footers read here are the ones the source orders its parts by: read once.
    extent = src.extent()
    b, w = choose_bucket(extent[1] - extent[0] if extent else None)
    return ViewerApp([src], bucket_ns=bucket_ns or b, window_ns=window_ns or w)


def summarize_dir(directory: str | Path, window_ns: int | None = None) -> str:
    """The dashboard as text for a trace dir (its last window), for --no-ui."""
    directory = Path(directory)
    src = DirSource(directory)
    extent = src.extent()
    b, w = choose_bucket(extent[1] - extent[0] if extent else None)
    model = LiveModel(bucket_ns=b)
    model.declare(src.manifests())
    window = window_ns or w or DEFAULT_BUCKET_NS * 100
    parts = usable_parts(directory) if directory.is_dir() else []
    stats = [src.stats(p) for p in parts]
    ends = [st.last_end_ns if st else None for st in stats]
    known = [e for e in ends if e is not None]
    # Only the parts that reach into the last window are read, part by part and only the
    # columns the model reads; the others are counted from their footers. (Every span of
    # 100M read into one feed took 19 GB; read part by part, 5 minutes.)
    cutoff = (max(known) - window - 2 * b) if known else None
    for path, st, end in zip(parts, stats, ends, strict=True):
        if cutoff is not None and st is not None and end is not None and end < cutoff:
            model.spans_total += st.rows
            continue
        t = read_part(path, INGEST_COLUMNS)
        if t is not None:
            model.ingest(t)
    snap = model.snapshot(window)
    return summary_text(snap, derive_alerts(snap))


def summary_text(snap: Snapshot, alerts: Sequence[Alert]) -> str:
    """Plain lines: load per chip type, the busiest links, alerts, the slowest ops."""
    if snap.empty:
        return "no spans yet"
    lines = [
        f"window {human_ns(snap.window_ns)} ending at the last span · "
        f"{human_count(snap.spans_total)} spans seen · dropped {snap.dropped:,}",
        "",
    ]
    for t in CHIP_TYPES:
        rows = snap.chips.get(t, [])
        if not rows:
            lines.append(f"  {t:<7} no chips")
            continue
        mean = sum(r.utilization for r in rows) / len(rows)
        top = ", ".join(f"{r.id} {r.utilization:.0%}" for r in rows[:6])
        lines.append(
            f"  {t:<7} {len(rows):>3} chips  avg {mean:4.0%}  ({top}{', …' if len(rows) > 6 else ''})"
        )
    if snap.links:
        lines.append("")
        busiest = sorted(snap.links, key=lambda r: -r.bytes_per_s)[:6]
        for r in busiest:
            sat = (
                f"{r.saturation:.0%} of bandwidth"
                if r.saturation is not None
                else f"busy {r.utilization:.0%}"
            )
            lines.append(f"  {r.id:<28} {human_bytes_per_s(r.bytes_per_s)}  {sat}")
    lines.append("")
    lines += [f"  ALERT {a.severity}: {a.message}" for a in alerts] or ["  no bottleneck alerts"]
    if snap.slowest:
        lines.append("")
        lines += [
            f"  slow  {s.name} on {s.where}: {human_ns(s.duration_ns)}" for s in snap.slowest[:5]
        ]
    return "\n".join(lines)


def save_screenshot(
    app, path: str | Path, size: tuple[int, int] = (100, 32), settle_s: float = 1.0
) -> Path:  # noqa: ANN001
    """Run `app` headless until its sources have been read, save the screen as SVG, quit."""
    path = Path(path)

    async def pilot_fn(pilot) -> None:  # noqa: ANN001
        last, still = -1, 0.0
        while still < settle_s:  # until nothing new arrives for settle_s
            await pilot.pause(0.1)
            n = app.model.spans_total
            still = still + 0.1 if n == last and n else 0.0
            last = n
        app.refresh_dashboard()
        await pilot.pause(0.2)
        app.save_screenshot(path.name, str(path.parent.resolve()))
        app.exit()

    path.parent.mkdir(parents=True, exist_ok=True)
    app.run(headless=True, size=size, auto_pilot=pilot_fn)
    return path


class LiveRun:
    """A producer (an emulation) in a background thread, feeding a viewer in-process.

    Args:
        target: called as target(feed) on the thread; its return value is kept in `result`.
    """

    def __init__(self, target: Callable[[SpanFeed], Any]) -> None:
        import threading

        self.target = target
        self.feed = SpanFeed()
        self.app: Any = None  # set by live_app: told to quit when the producer fails
        self.result: Any = None
        self.error: BaseException | None = None
        self.done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="chiptrace-live-run", daemon=True)

    def _run(self) -> None:
        try:
            self.result = self.target(self.feed)
        except BaseException as e:  # noqa: BLE001 - re-raised by the caller after the UI ends
            self.error = e
            if self.app is not None and self.app.is_running:
                self.app.call_from_thread(self.app.exit)
        finally:
            self.done.set()
            if self.error is None and self.app is not None and self.app.is_running:
                self.app.call_from_thread(
                    self.app.notify, "run finished: the dashboard holds its last window"
                )

    def start(self) -> LiveRun:
        self._thread.start()
        return self


def live_app(out: str | Path, target: Callable[[SpanFeed], Any], name: str):  # noqa: ANN201
    """A ViewerApp fed in-process by target(feed) (not started), with the store at `out`
    behind its explorer and SQL console. Returns (app, run); call run.start() first."""
    from chiptrace.viewer.app import ViewerApp
    from chiptrace.viewer.sources import FeedSource

    run = LiveRun(target)
    # A 1 s window of 10 ms buckets. Shorter windows show the host path (NIC, CPU, DPU) and
    # the NPUs at 0%: the emulator prefetches a step's input a step (~80 ms) ahead, and those
    # spans arrive with the step they feed, after the window has moved past them.
    app = ViewerApp(
        [FeedSource(out, name=name, done=run.done)],
        feed=run.feed,
        bucket_ns=DEFAULT_BUCKET_NS,
        window_ns=DEFAULT_BUCKET_NS * 100,
    )
    run.app = app
    return app, run


def emulator_app(out: str | Path, **kwargs: Any):  # noqa: ANN201 - imports Textual lazily
    """A ViewerApp showing `chiptrace.emulator.emulate(**kwargs)` live, paced to wall time."""

    def target(feed: SpanFeed) -> Any:
        from chiptrace.emulator.run import emulate

        return emulate(out=out, realtime=True, sinks=[feed], progress=False, **kwargs)

    return live_app(out, target, f"emulated {kwargs.get('topology', 'rack6')}")
