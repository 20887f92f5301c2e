"""`ViewerApp`: the Textual app behind `chiptrace view` and `chiptrace demo`.

Data flows one way: sources -> SpanFeed -> (ingest worker thread) -> LiveModel ->
(refresh timer on the UI thread) -> Snapshot -> widgets. The UI thread only reads the
window's buckets, so a refresh costs the same at 1M or 50M stored spans.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from textual import work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.css.query import NoMatches
from textual.reactive import reactive
from textual.widgets import Footer, Input, TabbedContent, TabPane
from textual.worker import get_current_worker

from chiptrace.errors import ChiptraceError
from chiptrace.viewer.alerts import Alert, derive_alerts, from_findings, merge
from chiptrace.viewer.live_model import DEFAULT_BUCKET_NS, LiveModel, Snapshot
from chiptrace.viewer.queries import LiveStore
from chiptrace.viewer.sources import Source, SpanFeed
from chiptrace.viewer.widgets.dashboard import Dashboard
from chiptrace.viewer.widgets.explorer import Explorer
from chiptrace.viewer.widgets.help_screen import HelpScreen
from chiptrace.viewer.widgets.sql_console import SqlConsole

ZOOM_STEPS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000)  # window = bucket x step
# The app's own one-key actions: a text box takes those keys as text.
# While a store is read and the window shows data, the dashboard redraws this often at
# most: redrawing ~200 chips ten times a second made the read of the window's parts on the
# 101M-span nvl72 store ~11% slower (2.60 -> 2.31 s to the whole window, mean of 4, 2 CPUs).
LOADING_REFRESH_S = 0.3
_APP_ACTIONS = frozenset(
    {"help", "show_tab", "toggle_pause", "zoom", "toggle_theme", "reload", "quit"}
)


class ViewerApp(App[None]):
    """The live viewer.

    Args:
        sources: pollers (`DirSource`, `FeedSource`, `OtlpSource`); the first one with a
            store_dir backs the explorer and the SQL console.
        feed: the queue sources and in-process producers write into (one is made if None).
        bucket_ns: the dashboard's finest time resolution.
        window_ns: the initial dashboard window (zoom with + and -).
        refresh_s: dashboard refresh period.
        poll_s: how often the ingest worker polls the sources and drains the feed.
        analysis_s: how often the analysis rules run over the window in DuckDB (needs a
            store; 0 turns them off).
    """

    CSS_PATH = "viewer.tcss"
    TITLE = "chiptrace"
    BINDINGS = [
        Binding("question_mark", "help", "Help"),
        Binding("d", "show_tab('dashboard')", "Dash"),
        Binding("e", "show_tab('explorer')", "Explore"),
        Binding("s", "show_tab('sql')", "SQL"),
        Binding("p", "toggle_pause", "Pause"),
        Binding("plus,equals_sign", "zoom(-1)", "Zoom+", key_display="+"),
        Binding("minus", "zoom(1)", "Zoom-", key_display="-"),
        Binding("t", "toggle_theme", "Theme", show=False),
        Binding("r", "reload", "Reload", show=False),
        Binding("q", "quit", "Quit"),
    ]

    paused = reactive(False)
    zoom = reactive(4)
    ended = reactive(False)  # every source has stopped and its spans are all shown

    def __init__(
        self,
        sources: Sequence[Source] = (),
        feed: SpanFeed | None = None,
        *,
        bucket_ns: int = DEFAULT_BUCKET_NS,
        window_ns: int | None = None,
        refresh_s: float = 0.1,
        poll_s: float = 0.1,
        analysis_s: float = 2.0,
    ) -> None:
        super().__init__()
        self.sources = list(sources)
        self.feed = feed or SpanFeed()
        self.model = LiveModel(bucket_ns=bucket_ns)
        self.refresh_s = refresh_s
        self.poll_s = poll_s
        self.refreshes = 0
        self.refresh_seconds = 0.0  # time spent in refreshes (the benchmark reads it)
        self._refreshed_at = 0.0  # time.monotonic() of the last refresh
        self.snapshot: Snapshot | None = None
        self.alerts: list[Alert] = []
        self.deep_alerts: list[Alert] = []  # from chiptrace.analysis, refreshed by a worker
        self.analysis_s = analysis_s
        self._analysis_running = False
        self._analysis_next = 0.0
        self._sources_ended = False  # set by the ingest worker, read by the refresh
        self._declared: dict[int, list[dict[str, Any]]] = {}  # source id -> manifests declared
        store_dir = next((s.store_dir for s in self.sources if s.store_dir), None)
        self.store = LiveStore(store_dir) if store_dir else None
        self.source_name = " + ".join(s.name for s in self.sources) or "feed"
        if window_ns:
            steps = [abs(window_ns - bucket_ns * s) for s in ZOOM_STEPS]
            self.set_reactive(ViewerApp.zoom, steps.index(min(steps)))

    def compose(self) -> ComposeResult:
        with TabbedContent(initial="dashboard", id="tabs"):
            with TabPane("Dashboard", id="dashboard"):
                yield Dashboard(id="dash")
            with TabPane("Explorer", id="explorer"):
                yield Explorer(self.store, id="explorer-view")
            with TabPane("SQL", id="sql"):
                yield SqlConsole(self.store, id="sql-console")
        yield Footer()

    def on_mount(self) -> None:
        self._ingest_loop()
        self.set_interval(self.refresh_s, self._tick)
        if self.store is not None and self.analysis_s > 0:
            self.set_interval(self.analysis_s, self.run_analysis)
        self.refresh_dashboard()

    def _main(self, selector: Any) -> Any:
        """A widget of the main screen, even while the help screen is on top."""
        if not self.screen_stack:
            raise NoMatches(f"no screen yet for {selector}")
        return self.screen_stack[0].query_one(selector)

    @property
    def window_ns(self) -> int:
        return self.model.bucket_ns * ZOOM_STEPS[self.zoom]

    # ------------------------------------------------------------ ingest

    def ingest_once(self) -> int:
        """Poll every source, drain the feed into the model; returns spans ingested."""
        dropped = self.feed.dropped
        for src in self.sources:
            src.poll(self.feed)
            manifests = src.manifests()
            if manifests and manifests != self._declared.get(id(src)):
                # once per change: an nvl72 rack's 5,000 links are no work for every poll
                self.model.declare(manifests)
                self._declared[id(src)] = manifests
            dropped += sum(int(m.get("spans_dropped") or 0) for m in manifests)
        batches = self.feed.drain()
        backlogs = [src.backlog() for src in self.sources]
        ends = [end for end, _ in backlogs if end is not None]
        self.model.ingest_all(batches, (max(ends) if ends else None, sum(k for _, k in backlogs)))
        self.model.dropped = dropped
        ended = bool(self.sources) and all(s.ended for s in self.sources)
        self._sources_ended = ended and not self.feed.pending
        return sum(b.num_rows for b in batches)

    @work(thread=True, exclusive=True, exit_on_error=False, group="ingest")
    def _ingest_loop(self) -> None:
        """Off the UI thread: NumPy folding of arriving batches (~1 ms per 10k spans)."""
        worker = get_current_worker()
        while not worker.is_cancelled:
            t = time.monotonic()
            try:
                self.ingest_once()
            except Exception as e:  # noqa: BLE001 - keep following; show why on screen
                self.call_from_thread(self.notify, f"ingest: {e}", severity="error")
            time.sleep(max(0.0, self.poll_s - (time.monotonic() - t)))

    # ------------------------------------------------------------ refresh

    def _tick(self) -> None:
        """The refresh timer: every refresh_s, or LOADING_REFRESH_S while a store is read
        (the first frame with data is not held back)."""
        snap = self.snapshot
        loading = snap is not None and snap.unread and not snap.empty
        if loading and time.monotonic() - self._refreshed_at < LOADING_REFRESH_S:
            return
        self.refresh_dashboard()

    def refresh_dashboard(self) -> None:
        """Redraw the dashboard from the window's buckets (skipped while paused)."""
        if self.paused:
            return
        t = time.perf_counter()
        self._refreshed_at = time.monotonic()
        self.ended = self._sources_ended
        self.snapshot = self.model.snapshot(self.window_ns)
        self.alerts = merge(derive_alerts(self.snapshot), self.deep_alerts)
        try:
            if self._main(TabbedContent).active == "dashboard":
                self._main(Dashboard).show(self.snapshot, self.alerts, self.source_name, self.state)
        except NoMatches:  # not composed yet, or already torn down
            pass
        self.refreshes += 1
        self.refresh_seconds += time.perf_counter() - t

    def run_analysis(self) -> None:
        """Start the analysis rules over the dashboard's window (in a worker)."""
        snap = self.snapshot
        if self.paused or snap is None or snap.empty or snap.loading or self.store is None:
            return  # (loading: a window cut short, and the rules would slow the read)
        if self._analysis_running or time.monotonic() < self._analysis_next:
            return
        self._analysis_running = True
        self._analyze(self.store, snap.since_ns, snap.until_ns)

    @work(thread=True, exclusive=True, exit_on_error=False, group="analysis")
    def _analyze(self, store: LiveStore, since_ns: int, until_ns: int) -> None:
        """DuckDB over the window: tens of ms to seconds, so never on the UI thread."""
        t = time.monotonic()
        try:
            found = from_findings(store.findings(since_ns, until_ns))
        except (ChiptraceError, ImportError):
            found = []
        finally:
            # Keep the rules under ~20% of a core on a big store: wait 4x their cost.
            self._analysis_next = time.monotonic() + 4 * (time.monotonic() - t)
            self._analysis_running = False
        self.call_from_thread(setattr, self, "deep_alerts", found)

    @property
    def state(self) -> str:
        """What the status line says: PAUSED (by the user), LOADING (a store's parts are
        still being read), ENDED (the sources stopped and everything they sent is shown),
        else LIVE."""
        if self.paused:
            return "PAUSED"
        if self.snapshot is not None and self.snapshot.unread:
            return "LOADING"
        return "ENDED" if self.ended else "LIVE"

    def watch_paused(self, paused: bool) -> None:
        self.set_class(paused, "-paused")
        self._redraw_status()

    def watch_ended(self, ended: bool) -> None:
        self.set_class(ended, "-ended")
        self._redraw_status()

    def _redraw_status(self) -> None:
        if self.snapshot is not None:  # before compose, _main raises NoMatches
            try:
                self._main(Dashboard).show(self.snapshot, self.alerts, self.source_name, self.state)
            except NoMatches:
                pass

    def watch_zoom(self) -> None:
        self.refresh_dashboard()  # before compose it only takes a snapshot

    # ------------------------------------------------------------ actions

    def action_help(self) -> None:
        self.push_screen(HelpScreen())

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """Only keys that do something where the focus is (the footer shows these): none of
        the app's letters while the SQL box takes them as text, the dashboard's keys on the
        dashboard, reload in the explorer, and no key for the tab already shown."""
        if action not in _APP_ACTIONS or not self.screen_stack:
            return True
        if isinstance(self.focused, Input):
            return False
        try:
            active = self._main(TabbedContent).active
        except NoMatches:
            return True
        if action in ("toggle_pause", "zoom"):
            return active == "dashboard"
        if action == "reload":
            return active == "explorer"
        if action == "show_tab":
            return parameters[:1] != (active,)
        return True

    def action_show_tab(self, tab: str) -> None:
        # Focus leaves the pane first: a focused widget in the pane being hidden would
        # otherwise make TabbedContent switch straight back to it (`s`, Escape, `d`).
        self.set_focus(None)
        self._main(TabbedContent).active = tab
        self.on_tabbed_content_tab_activated(None)

    def on_tabbed_content_tab_activated(self, event: object) -> None:
        active = self._main(TabbedContent).active
        if active == "explorer":
            self._main(Explorer).reload()
            self._main("#waterfall").focus()
        elif active == "sql":
            self._main("#sql-input").focus()
        elif active == "dashboard":
            self.refresh_dashboard()
        self.refresh_bindings()

    def on_descendant_focus(self, event: object) -> None:
        self.refresh_bindings()

    def action_toggle_pause(self) -> None:
        self.paused = not self.paused

    def action_zoom(self, delta: int) -> None:
        self.zoom = min(max(self.zoom + delta, 0), len(ZOOM_STEPS) - 1)

    def action_toggle_theme(self) -> None:
        self.theme = "textual-light" if self.current_theme.dark else "textual-dark"

    def action_reload(self) -> None:
        if self._main(TabbedContent).active == "explorer":
            self._main(Explorer).reload()

    def on_unmount(self) -> None:
        for src in self.sources:
            src.stop()
        if self.store is not None:
            self.store.close()


def store_path(app: ViewerApp) -> Path | None:
    """The trace dir behind the explorer and SQL console, if any."""
    return app.store.directory if app.store else None
