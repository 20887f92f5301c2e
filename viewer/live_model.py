"""The live model behind the dashboard: incremental, windowed accumulators over span batches.

Every arriving Arrow batch is folded into per-chip and per-link busy-time (and bytes)
accumulators laid on a ring of fixed-width time buckets, with NumPy: each span is clipped
to the buckets it overlaps and its overlap added in. A snapshot then reads only the buckets
of the window on screen, so a refresh costs O(window x chips), never O(spans stored).

Busy time is the sum of span time per bucket, capped at the bucket width when shown: spans
that overlap on one chip (two streams) count once the chip is full. This matches the store's
``utilization()`` SQL macro when a chip's op spans do not overlap, which is what the emulator
and most instrumented code produce.

This module draws nothing and never imports Textual: the benchmark and tests use it alone.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import pyarrow as pa

from chiptrace.schema import CHIP_TYPES
from chiptrace.topology import parse_topology
from chiptrace.viewer._ring import (
    Ring,
    add_at,
    direction_key,
    ints,
    natural,
    numbers,
    pieces,
    strings,
    unique_rows,
)
from chiptrace.viewer.snapshot import SeriesRow, SlowSpan, Snapshot

DEFAULT_BUCKET_NS = 10_000_000  # 10 ms: fine enough for a live rack, 4096 of them = 41 s
DEFAULT_BUCKETS = 4096
HISTORY_CELLS = 24
#: The span columns `LiveModel.ingest` reads.
INGEST_COLUMNS = [
    "name",
    "start_ns",
    "end_ns",
    "chip_id",
    "chip_type",
    "link_id",
    "link_type",
    "link_src",
    "link_dst",
    "op_kind",
    "op_bytes",
]
HISTORY_LINKS = 32  # links given a history (the busiest); the rest: the window only
SLOW_KEEP = 16  # slowest spans kept per batch; the window's slowest are among them


class LiveModel:
    """Per-chip and per-link busy time per bucket, the slowest spans, ingest counters.

    Thread-safe: `ingest` runs on a feed or poller thread, `snapshot` on the UI thread.

    Args:
        bucket_ns: bucket width; the finest time resolution the dashboard shows.
        n_buckets: buckets kept; history older than bucket_ns * n_buckets is forgotten.
    """

    def __init__(
        self, bucket_ns: int = DEFAULT_BUCKET_NS, n_buckets: int = DEFAULT_BUCKETS
    ) -> None:
        self.bucket_ns = int(bucket_ns)
        self.n_buckets = int(n_buckets)
        self.chips = Ring(self.n_buckets)
        self.links = Ring(self.n_buckets)
        self.head = -1  # absolute index of the newest bucket with data
        self.first = -1  # absolute index of the oldest bucket with data
        self.head_ns = 0
        self.spans_total = 0
        self.dropped = 0
        self._slow: dict[int, list[SlowSpan]] = {}  # end bucket -> its slowest spans
        self._ingest_log: collections.deque[tuple[float, int]] = collections.deque()
        self._orders: dict[int, list[tuple[str, int]]] = {}
        self._lock = threading.Lock()
        # Spans the sources hold and have not sent yet (a store is read newest part first;
        # `ingest_all`): time up to their latest end is incomplete, so a snapshot starts
        # after it.
        self.unread_until_ns: int | None = None
        self.unread = 0

    # ------------------------------------------------------------ topology

    def declare(self, manifests: Iterable[Mapping[str, Any]]) -> None:
        """Add the chips and links a run manifest's topology declares, with bandwidths,
        so an idle chip shows 0% instead of being missing."""
        for m in manifests:
            # the report reads the same manifest with the same function (chiptrace.topology)
            topo = parse_topology(m)
            with self._lock:
                # Room for the keys not there yet: a manifest declared again (a writer
                # updates it each flush) must not grow the rings (~330 MB on an nvl72 rack).
                new_chips = sum(cid not in self.chips.keys for cid in topo.chips)
                self.chips.reserve(len(self.chips.meta) + new_chips)
                # Each link's two directions are rows of their own (see _ingest_links).
                new_links = sum(lk.id not in self.links.keys for lk in topo.links)
                self.links.reserve(len(self.links.meta) + 2 * new_links)
                for cid, c in topo.chips.items():
                    if c.type in CHIP_TYPES:
                        self.chips.row(cid, type=c.type)
                for lk in topo.links:
                    self.links.row(
                        lk.id,
                        type=lk.type,
                        src=lk.src or None,
                        dst=lk.dst or None,
                        bandwidth=lk.bandwidth or None,
                    )

    # ------------------------------------------------------------ ingest

    def ingest(self, batch: pa.RecordBatch | pa.Table) -> None:
        """Fold one batch of the span schema into the accumulators. Cost: O(rows)."""
        with self._lock:
            self._ingest(batch)

    def ingest_all(
        self, batches: list[pa.RecordBatch | pa.Table], backlog: tuple[int | None, int]
    ) -> None:
        """Fold in what the sources sent in one poll, then note what they hold back.

        While sources hold spans back (a store read newest part first), a snapshot taken
        between two of these batches must not count the time the others reach into as
        complete: until all are in, that time counts as unread too. Each batch takes the
        lock on its own, so the dashboard redraws between them."""
        until, unread = backlog
        with self._lock:
            if until is not None or self.unread_until_ns is not None:
                ends = [int(ints(b.column("end_ns")).max()) for b in batches if b.num_rows]
                self.unread_until_ns = max([*ends, until if until is not None else -1])
                self.unread = unread + sum(b.num_rows for b in batches)
        for batch in batches:
            with self._lock:
                self._ingest(batch)
        with self._lock:
            self.unread_until_ns, self.unread = until, unread

    def _ingest(self, batch: pa.RecordBatch | pa.Table) -> None:
        n = batch.num_rows
        if not n:
            return
        start = ints(batch.column("start_ns"))
        end = ints(batch.column("end_ns"))
        end = np.maximum(end, start)
        first = int(start.min()) // self.bucket_ns
        self.first = first if self.first < 0 else min(self.first, first)
        self._advance(int(end.max()))
        self._ingest_chips(batch, start, end)
        self._ingest_links(batch, start, end)
        self._keep_slowest(batch, start, end)
        self.spans_total += n
        self._ingest_log.append((time.monotonic(), n))

    def note_dropped(self, n: int) -> None:
        """Count spans a source lost (a full feed queue, a manifest's spans_dropped)."""
        with self._lock:
            self.dropped += n

    def _advance(self, max_end: int) -> None:
        new_head = (max_end - 1) // self.bucket_ns
        if self.head < 0:
            self.head = new_head
        elif new_head > self.head:
            gap = new_head - self.head
            # Rows past the keys in use hold zeros already (reserved, never written): left
            # alone, their pages are never touched (an nvl72 rack reserves ~330 MB).
            slots = np.arange(self.head + 1, new_head + 1) % self.n_buckets
            nc, nl = len(self.chips.meta), len(self.links.meta)
            for a, used in ((self.chips.busy, nc), (self.links.busy, nl), (self.links.bytes, nl)):
                if gap >= self.n_buckets:
                    a[:used] = 0
                else:
                    a[:used, slots] = 0
            self.head = new_head
        self.head_ns = max(self.head_ns, max_end)

    def _ingest_chips(self, batch: pa.RecordBatch, start: np.ndarray, end: np.ndarray) -> None:
        codes, values = strings(batch.column("chip_id"))
        tcodes, tvalues = strings(batch.column("chip_type"))
        kcodes, kvalues = strings(batch.column("op_kind"))
        idle = kvalues.index("idle") if "idle" in kvalues else -2
        mask = (codes >= 0) & (kcodes != idle)
        if not mask.any():
            return
        rows = np.full(len(values), -1, dtype=np.int64)
        first_type: dict[int, int] = {}  # dictionary code -> its first chip type code
        for c, t in zip(codes[mask], tcodes[mask], strict=True):
            first_type.setdefault(c, t)
        for c, t in first_type.items():
            cid = values[c]
            if cid is None:  # a null in the dictionary itself: no chip
                continue
            ctype = tvalues[t] if t >= 0 else cid.rsplit("/", 1)[-1].split(":")[0]
            if ctype in CHIP_TYPES:
                rows[c] = self.chips.row(cid, type=ctype)
        r = rows[np.where(mask, codes, 0)]
        keep = mask & (r >= 0)
        pr, slots, over, _ = self._pieces(r[keep], start[keep], end[keep])
        add_at(self.chips.busy, pr, slots, over)

    def _ingest_links(self, batch: pa.RecordBatch, start: np.ndarray, end: np.ndarray) -> None:
        codes, values = strings(batch.column("link_id"))
        mask = codes >= 0
        if not mask.any():
            return
        tcodes, tvalues = strings(batch.column("link_type"))
        scodes, svalues = strings(batch.column("link_src"))
        dcodes, dvalues = strings(batch.column("link_dst"))
        # A link direction is its own resource (links are full duplex).
        uniq, first, inverse = unique_rows(
            codes[mask], scodes[mask], dcodes[mask], (len(values), len(svalues), len(dvalues))
        )
        tmask = tcodes[mask]
        rows = np.empty(len(uniq), dtype=np.int64)
        for i, (c, s, d) in enumerate(uniq):
            j = int(first[i])
            lid = values[c]
            src = svalues[s] if s >= 0 else None
            dst = dvalues[d] if d >= 0 else None
            ltype = tvalues[tmask[j]] if tmask[j] >= 0 else lid.split(":")[0]
            key = direction_key(lid, ltype, src, dst)
            base = self.links.keys.get(lid)  # the other direction has the same bandwidth
            bw = self.links.meta[base].get("bandwidth") if base is not None else None
            rows[i] = self.links.row(key, type=ltype, src=src, dst=dst, bandwidth=bw)
        r = rows[inverse]
        s, e = start[mask], end[mask]
        nbytes = ints(batch.column("op_bytes"), fill=0)[mask].astype(np.float64)
        zero = (e == s) & (e > self._ring_start())
        if zero.any():  # zero-length transfers: all their bytes land in one bucket
            slots = (s[zero] // self.bucket_ns) % self.n_buckets
            add_at(self.links.bytes, r[zero], slots, nbytes[zero])
        rate = nbytes / np.maximum(e - s, 1)  # bytes spread evenly over the transfer
        pr, slots, over, src = self._pieces(r, s, e)
        add_at(self.links.busy, pr, slots, over)
        add_at(self.links.bytes, pr, slots, over * rate[src])

    def _ring_start(self) -> int:
        """The start of the oldest bucket the ring holds."""
        return (self.head - self.n_buckets + 1) * self.bucket_ns

    def _pieces(
        self, rows: np.ndarray, s: np.ndarray, e: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        return pieces(rows, s, e, self.bucket_ns, self.n_buckets, self._ring_start())

    def _keep_slowest(self, batch: pa.RecordBatch, start: np.ndarray, end: np.ndarray) -> None:
        # Ops only: spans on a chip or link (a root span is as long as its whole step).
        on = numbers(batch.column("chip_id").is_valid()) | numbers(
            batch.column("link_id").is_valid()
        )
        dur = np.where(on, end - start, -1)
        # The slowest SLOW_KEEP without sorting the batch (a sort of 370k took ~9 ms).
        top = np.argpartition(dur, -SLOW_KEEP)[-SLOW_KEEP:] if len(dur) > SLOW_KEEP else None
        top = np.argsort(dur)[::-1] if top is None else top[np.argsort(dur[top])[::-1]]
        top = top[dur[top] >= 0]
        if not len(top):
            return
        # Scalar by scalar: take() of an index list makes it an Arrow array, which imports
        # pandas (see _ring.numbers).
        names, chips, links = (
            [col[int(i)].as_py() for i in top]
            for col in (batch.column(c) for c in ("name", "chip_id", "link_id"))
        )
        for n, c, lk, i in zip(names, chips, links, top, strict=True):
            k = (int(end[i]) - 1) // self.bucket_ns
            kept = self._slow.setdefault(k, [])
            kept.append(SlowSpan(str(n), c or lk or "-", int(dur[i]), int(end[i])))
            if len(kept) > SLOW_KEEP:
                kept.sort(key=lambda s: -s.duration_ns)
                del kept[SLOW_KEEP:]
        if len(self._slow) > 2 * self.n_buckets:  # forget buckets the ring no longer holds
            horizon = self.head - self.n_buckets
            for k in [k for k in self._slow if k <= horizon]:
                del self._slow[k]

    # ------------------------------------------------------------ snapshot

    def snapshot(self, window_ns: int, cells: int = HISTORY_CELLS) -> Snapshot:
        """Utilization over the latest `window_ns` (bucket-aligned), plus `cells` earlier
        windows of history, the window's slowest spans and the ingest rate."""
        with self._lock:
            return self._snapshot(window_ns, cells)

    def _snapshot(self, window_ns: int, cells: int) -> Snapshot:
        b = self.bucket_ns
        wb = int(min(max(1, window_ns // b), self.n_buckets))
        cells = max(1, min(cells, self.n_buckets // wb))
        head = max(self.head, 0)
        # A window reaching back before the first data (a run's first seconds, a short
        # trace) is measured from that data on: time before it is not idle time. Nor is
        # time spans not read yet may fill: buckets from `floor` on hold all their spans.
        unread = -(-self.unread_until_ns // b) if self.unread_until_ns is not None else -1
        floor = max(self.first, unread)
        since = max((head - wb + 1) * b, floor * b)
        until = max(min((head + 1) * b, self.head_ns), since + 1)
        first = head - cells * wb + 1
        idx = np.arange(first, head + 1)
        slots = idx % self.n_buckets
        valid = (idx > self.head - self.n_buckets) & (idx >= floor)  # held, complete
        span_ns = np.full(cells, float(wb * b))
        span_ns[-1] = until - since  # the newest window is only partly elapsed

        cells_valid = valid.reshape(cells, wb).any(axis=1)

        cur = slots[-wb:][valid[-wb:]]  # the window's buckets

        def current(acc: np.ndarray, n: int, cap: bool) -> np.ndarray:
            per = acc[:n][:, cur]
            return (np.minimum(per, b) if cap else per).sum(axis=1, dtype=np.float64) / span_ns[-1]

        def history(acc: np.ndarray, rows: np.ndarray) -> np.ndarray:
            per = np.minimum(acc[rows][:, slots], b) * valid
            hist = per.reshape(len(rows), cells, wb).sum(axis=2, dtype=np.float64) / span_ns
            hist[:, ~cells_valid] = np.nan
            return np.clip(hist, 0, 1)

        nc, nl = len(self.chips.meta), len(self.links.meta)
        cu = current(self.chips.busy, nc, True)
        ch = history(self.chips.busy, np.arange(nc))
        lu = current(self.links.busy, nl, True)
        lb = current(self.links.bytes, nl, False)
        # History only for the links a panel can show: a rack has thousands of link directions.
        bw = np.array([m.get("bandwidth") or np.nan for m in self.links.meta])
        load = np.where(np.isfinite(bw), lb * 1e9 / np.where(np.isfinite(bw), bw, 1), lu)
        top = np.argsort(-load, kind="stable")[:HISTORY_LINKS]
        lh = dict(zip(top.tolist(), history(self.links.busy, top), strict=True))
        blank = np.full(cells, np.nan)
        cu, lu, lb = np.clip(cu, 0, 1).tolist(), np.clip(lu, 0, 1).tolist(), (lb * 1e9).tolist()
        chips: dict[str, list[SeriesRow]] = {t: [] for t in CHIP_TYPES}
        for cid, r in self._order(self.chips):
            ctype = self.chips.meta[r]["type"]
            chips[ctype].append(SeriesRow(cid, ctype, cu[r], ch[r]))
        links = []
        for lid, r in self._order(self.links):
            m = self.links.meta[r]
            links.append(
                SeriesRow(
                    lid,
                    str(m.get("type")),
                    lu[r],
                    lh.get(r, blank),
                    bytes_per_s=lb[r],
                    bandwidth=m.get("bandwidth"),
                    src=m.get("src"),
                    dst=m.get("dst"),
                )
            )
        return Snapshot(
            since,
            until,
            wb * b,
            chips,
            links,
            self._slowest(since),
            self.spans_total,
            self._rate(),
            self.dropped,
            self.head_ns if self.head >= 0 else 0,
            unread=self.unread,
            loading=unread > head - wb + 1,
            covered=floor <= self.head,
        )

    def _order(self, ring: Ring) -> list[tuple[str, int]]:
        """(key, row) in natural order (gpu:2 before gpu:10), re-sorted only when keys change."""
        cached = self._orders.get(id(ring))
        if cached is None or len(cached) != len(ring.keys):
            cached = self._orders[id(ring)] = sorted(
                ring.keys.items(), key=lambda kv: natural(kv[0])
            )
        return cached

    def _slowest(self, since: int, n: int = 10) -> list[SlowSpan]:
        """The slowest spans that ended in the window: O(window buckets)."""
        first = since // self.bucket_ns
        if len(self._slow) < self.head - first + 1:
            pool = [s for k, spans in self._slow.items() if k >= first for s in spans]
        else:
            pool = [s for k in range(first, self.head + 1) for s in self._slow.get(k, ())]
        return sorted((s for s in pool if s.end_ns > since), key=lambda s: -s.duration_ns)[:n]

    def _rate(self, horizon_s: float = 2.0) -> float:
        now = time.monotonic()
        while self._ingest_log and self._ingest_log[0][0] < now - horizon_s:
            self._ingest_log.popleft()
        return sum(n for _, n in self._ingest_log) / horizon_s


__all__ = ["LiveModel", "SeriesRow", "SlowSpan", "Snapshot", "DEFAULT_BUCKET_NS", "HISTORY_CELLS"]
