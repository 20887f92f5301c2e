"""Chrome Trace Event Format JSON, which Perfetto (ui.perfetto.dev) and chrome://tracing open.

Layout: one process per host and resource (a rank of a job, a service), named by metadata
(`M`) events that carry the resource, so an import of the file gives each span its own
process's resource back; in it one track (thread) per chip, per link and, for spans on
neither, per service, sorted chips first (in CHIP_TYPES order), then links. Spans are
complete (`X`) events with their ids and attributes as args; span events are
thread-scoped instants. A track's slices must nest strictly, so spans that overlap on one
chip without nesting (two streams, two threads) go to sub-tracks named `gpu:0 #2`,
`gpu:0 #3`, ... Flow events (`s`/`f`) join every span link (the `links` column), drawn
forward in time, and each transfer to its child spans.

Streamed in time order with bounded memory: DuckDB sorts (spilling past its memory limit),
one record batch of rows is in Python at a time, and the placement of each span (for the
flows) goes to a temporary Parquet file. Past `split_mb` the document continues in
`NAME-002.json`, ...: each file a window of time over every track, complete and loadable
alone (its own process and thread metadata; flows whose two ends are in it).

Times are microseconds from the first span's start (the file's `otherData.t0_unix_ns`,
the same in every file of a split export), printed to the nanosecond: Unix-epoch
microseconds as doubles would lose the nanoseconds.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from chiptrace import _attributes as A
from chiptrace.exporters import chrome_sql as Q
from chiptrace.exporters.source import SpanSource
from chiptrace.exporters.textfile import TextSeries, write_series
from chiptrace.schema import CHIP_TYPES

log = logging.getLogger("chiptrace")

# chrome://tracing reads a file into one JavaScript string: V8 caps those near 256 MB
# (google/trace-viewer#627, catapult#298, "256MB file limit"); Perfetto's UI runs in
# WebAssembly with about 2 GB of memory and needs 2-4x a trace's size at runtime (Perfetto
# docs, "Visualising large traces"; a 900 MB JSON file crashed it, google/perfetto#99).
# 200 MB of slices, plus the flows written at each file's end, stays under both.
DEFAULT_SPLIT_MB = 200.0
_SLICE_SHARE = 0.9  # of a file's limit for slices; flows come at its end
_BATCH = 16_384  # rows fetched from DuckDB at a time
_CHUNK = 1_024  # rows in Python at a time, and between two size checks
_PLACED = pa.schema(
    [("trace_id", pa.binary()), ("span_id", pa.binary()), ("pid", pa.int32()), ("tid", pa.int32())]
)


def _track_key(row: dict[str, Any]) -> tuple[int, str, str]:
    """(group order, sort name, display name): chips by type then index, links, services."""
    chip, link = row.get("chip_id"), row.get("link_id")
    if chip:
        ctype = row.get("chip_type") or chip.rsplit("/", 1)[-1].partition(":")[0]
        order = CHIP_TYPES.index(ctype) if ctype in CHIP_TYPES else len(CHIP_TYPES)
        index = chip.rsplit(":", 1)[-1]
        return (0, f"{order:02d}{index.zfill(6) if index.isdigit() else index}{chip}", chip)
    if link:
        return (1, link, link)
    service = row.get("service") or "spans"
    return (2, service, service)


def assign_lanes(spans: list[tuple[int, int, int]]) -> dict[int, int]:
    """Lane per span so that each lane nests strictly: greedy first fit over a stack per lane.

    Args:
        spans: (start_ns, end_ns, key) on one track.

    Returns:
        key -> lane (0 is the track itself).
    """
    lanes: list[list[int]] = []
    return {
        key: _place(lanes, start, end)
        for start, end, key in sorted(spans, key=lambda s: (s[0], -s[1]))
    }


def _us(ns: int) -> float:
    return round(ns / 1000, 3)


@dataclass
class ChromeExport:
    """What `write_chrome_json` wrote: slices (spans), flows, and the files."""

    slices: int = 0
    flows: int = 0
    files: list[Path] = field(default_factory=list)


def _process_names(keys: list[tuple[str, str, str]]) -> dict[tuple[str, str, str], str]:
    """The host alone when it has one process; else host and service (a rank's service
    names the rank), numbered where two resources share both."""
    per_host: dict[str, int] = {}
    for h, _, _ in keys:
        per_host[h] = per_host.get(h, 0) + 1
    names: dict[tuple[str, str, str], str] = {}
    seen: dict[str, int] = {}
    for key in keys:
        h, svc, _ = key
        name = h if per_host[h] == 1 else f"{h} {svc or 'spans'}"
        seen[name] = seen.get(name, 0) + 1
        names[key] = name if seen[name] == 1 else f"{name} #{seen[name]}"
    return names


def _process_meta(pid: int, key: tuple[str, str, str], name: str) -> list[dict[str, Any]]:
    h, svc, res = key
    resource = A.resource({"resource": res})
    labels = [f"service={svc}"] if svc else []
    if "distributed.rank" in resource:
        labels.append(f"rank={resource['distributed.rank']}")
    args = {"name": name, "host": h, "service": svc, "resource": A.json_safe(resource)}
    meta = [
        {"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": args},
        {
            "ph": "M",
            "name": "process_sort_index",
            "pid": pid,
            "tid": 0,
            "args": {"sort_index": pid},
        },
    ]
    if labels:
        meta.append(
            {
                "ph": "M",
                "name": "process_labels",
                "pid": pid,
                "tid": 0,
                "args": {"labels": ",".join(labels)},
            }
        )
    return meta


class _Writer:
    """Streams Trace Event Format documents: slices in time order with lanes assigned
    online per track, a new file when one is full, each file's flows at its end."""

    def __init__(self, source: SpanSource, out: TextSeries, spill: Path) -> None:
        self.source, self.out, self.spill = source, out, spill
        self.result = ChromeExport()
        self.t0 = 0
        self._first = True
        self._file = 0
        self._file_slices = 0
        self._meta: list[dict[str, Any]] = []  # process metadata, at the top of every file
        self._named: set[int] = set()  # tids named in the current file
        self._placed: pq.ParquetWriter | None = None
        self._file_spans: list[tuple[int, bool]] = []  # per file: slices, nothing written yet

    def _emit(self, events: list[dict[str, Any]]) -> None:
        if events:
            # allow_nan=False: a NaN that slipped past json_safe fails here, not in Perfetto
            text = json.dumps(events, separators=(",", ":"), allow_nan=False)[1:-1]
            self.out.write(text if self._first else "," + text)
            self._first = False

    def run(self) -> ChromeExport:
        batches = list(self.source.stream(Q.TRACKS_SQL))
        tracks = pa.Table.from_batches(batches).to_pylist() if batches else []
        self.t0 = min((r["t0"] for r in tracks), default=0)
        keys = sorted({(r["h"], r["svc"], r["res"]) for r in tracks})
        pids = {k: i + 1 for i, k in enumerate(keys)}
        names = _process_names(keys)
        self._meta = [m for k in keys for m in _process_meta(pids[k], k, names[k])]
        order = sorted(tracks, key=lambda r: (r["h"], r["svc"], r["res"], _track_key(r)[:2]))
        self.source.con.register(
            "chiptrace_tracks",
            pa.table(
                {
                    "h": [r["h"] for r in order],
                    "svc": [r["svc"] for r in order],
                    "res": [r["res"] for r in order],
                    "track": [r["track"] for r in order],
                    "rank": list(range(len(order))),
                }
            ),
        )
        track_pid = [pids[(r["h"], r["svc"], r["res"])] for r in order]
        track_name = [_track_key(r)[2] for r in order]
        self._open_file()
        self._slices(track_pid, track_name)
        self._hold_file()
        # Flows join spans across the whole file, so they come once its slices are all
        # written: each file is resumed for its flows and its end.
        for k, (slices, empty) in enumerate(self._file_spans):
            self.out.resume(k)
            self._first = empty
            self._flows(self.spill / f"placed-{k + 1}.parquet")
            # No displayTimeUnit: ts and dur are microseconds, the format's unit; viewers
            # that honour "ns" there would draw every span 1000x too short.
            self.out.write(
                f'],"otherData":{{"generator":"chiptrace","t0_unix_ns":{self.t0},'
                f'"spans":{slices},"part":{k + 1}}}}}'
            )
        return self.result

    def _open_file(self) -> None:
        self._file += 1
        self._first, self._file_slices, self._named = True, 0, set()
        self.out.write('{"traceEvents":[')
        self._emit(self._meta)
        self._placed = pq.ParquetWriter(self.spill / f"placed-{self._file}.parquet", _PLACED)

    def _hold_file(self) -> None:
        assert self._placed is not None
        self._placed.close()
        self._file_spans.append((self._file_slices, self._first))
        self.out.hold()

    def _slices(self, track_pid: list[int], track_name: list[str]) -> None:
        lanes: dict[int, list[list[int]]] = {}
        tids: dict[tuple[int, int], int] = {}
        limit = self.out.limit * _SLICE_SHARE if self.out.limit else None
        for batch in self.source.stream(Q.SLICES_SQL, _BATCH):
            # A chunk at a time, so a file is cut within ~_CHUNK slices of its limit.
            for off in range(0, batch.num_rows, _CHUNK):
                chunk = batch.slice(off, _CHUNK)
                events: list[dict[str, Any]] = []
                pids, tids_ = [], []
                for row in chunk.to_pylist():
                    rank = row["_rank"]
                    lane = _place(lanes.setdefault(rank, []), row["start_ns"], row["end_ns"])
                    pid = track_pid[rank]
                    tid = tids.setdefault((rank, lane), len(tids) + 1)
                    if tid not in self._named:
                        self._named.add(tid)
                        name = track_name[rank] if lane == 0 else f"{track_name[rank]} #{lane + 1}"
                        events += _thread_meta(pid, tid, name, rank * 1_000_000 + lane)
                    self._slice(events, row, pid, tid)
                    pids.append(pid)
                    tids_.append(tid)
                self._emit(events)
                self._place_chunk(chunk, pids, tids_)
                if limit is not None and self.out.size > limit:
                    self._hold_file()
                    self.out.open()
                    self._open_file()

    def _place_chunk(self, chunk: pa.RecordBatch, pids: list[int], tids: list[int]) -> None:
        """Where a chunk's spans went (for the flows of their file)."""
        self.result.slices += chunk.num_rows
        self._file_slices += chunk.num_rows
        assert self._placed is not None
        self._placed.write_table(
            pa.table(
                [
                    chunk.column("trace_id").cast(pa.binary()),
                    chunk.column("span_id").cast(pa.binary()),
                    pa.array(pids, pa.int32()),
                    pa.array(tids, pa.int32()),
                ],
                schema=_PLACED,
            )
        )

    def _slice(self, events: list[dict[str, Any]], row: dict[str, Any], pid: int, tid: int) -> None:
        args: dict[str, Any] = {
            "trace_id": A.hex_id(row["trace_id"]),
            "span_id": A.hex_id(row["span_id"]),
        }
        if row.get("parent_span_id") is not None:
            args["parent_span_id"] = A.hex_id(row["parent_span_id"])
        if row.get("service"):
            args["service"] = row["service"]
        args.update(A.json_safe(A.attributes(row)))
        links = A.links(row)
        if links:  # drawn as flows; kept here too, so an import gets the span links back
            args["links"] = A.json_safe(links)
        if row.get("status_code") == 2:
            args["status"] = "ERROR" + (
                f": {row['status_message']}" if row.get("status_message") else ""
            )
        events.append(
            {
                "ph": "X",
                "name": row["name"],
                "cat": row.get("op_kind") or "span",
                "ts": _us(row["start_ns"] - self.t0),
                "dur": _us(row["end_ns"] - row["start_ns"]),
                "pid": pid,
                "tid": tid,
                "args": args,
            }
        )
        for ev in A.events(row):
            events.append(
                {
                    "ph": "i",
                    "s": "t",
                    "name": str(ev.get("name", "")),
                    "pid": pid,
                    "tid": tid,
                    "ts": _us(int(ev.get("time_ns", row["start_ns"])) - self.t0),
                    "args": A.json_safe(ev.get("attributes") or {}),
                }
            )

    def _flows(self, placed: Path) -> None:
        """A flow arrow for every span link, and from each transfer to its children, whose
        two spans are in this file.

        Flows run forward in time: the earlier span is the source (a link to a later span
        is drawn from the linking span), the arrow leaves the source at the latest instant
        it can and lands where the destination is running then, or at its start. "s" and
        "f" bind to the slice enclosing their ts, so both are inside their spans."""
        con = self.source.con
        path = str(placed).replace("'", "''")
        con.execute(f"CREATE OR REPLACE TEMP VIEW chiptrace_placed AS FROM read_parquet('{path}')")
        con.execute(Q.FILE_SQL)
        for batch in self.source.stream(Q.FLOWS_SQL, _BATCH):
            events: list[dict[str, Any]] = []
            for f in batch.to_pylist():
                self.result.flows += 1
                common = {"id": self.result.flows, "name": "feeds", "cat": "flow"}
                events.append(
                    {
                        "ph": "s",
                        **common,
                        "pid": f["spid"],
                        "tid": f["stid"],
                        "ts": _us(f["s_ts"] - self.t0),
                    }
                )
                events.append(
                    {
                        "ph": "f",
                        "bp": "e",
                        **common,
                        "pid": f["dpid"],
                        "tid": f["dtid"],
                        "ts": _us(f["d_ts"] - self.t0),
                    }
                )
            self._emit(events)


def _thread_meta(pid: int, tid: int, name: str, sort_index: int) -> list[dict[str, Any]]:
    return [
        {"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": name}},
        {
            "ph": "M",
            "name": "thread_sort_index",
            "pid": pid,
            "tid": tid,
            "args": {"sort_index": sort_index},
        },
    ]


def _place(lanes: list[list[int]], start: int, end: int) -> int:
    """The first lane where [start, end) nests, given spans in (start, -end) order; each
    lane holds the end times of its open (enclosing) slices."""
    for i, stack in enumerate(lanes):
        while stack and stack[-1] <= start:
            stack.pop()
        if not stack or stack[-1] >= end:
            stack.append(end)
            return i
    lanes.append([end])
    return len(lanes) - 1


def write_chrome_json(
    spans: pa.Table | SpanSource,
    path: str | os.PathLike[str],
    split_mb: float | None = None,
) -> ChromeExport:
    """Write spans as Chrome/Perfetto JSON, streamed with bounded memory.

    Args:
        spans: a table of spans_raw columns, or a SpanSource (trace dirs and filters).
        path: the file (written under a temporary name, renamed when complete), or `-`.
        split_mb: when the document would pass about this many MB, write `NAME-001.json`,
            `NAME-002.json`, ... beside `path` instead, each a window of time that loads
            on its own. None or 0: one file whatever its size.

    Returns:
        Slices and flows written, and the files.

    Raises:
        ChiptraceError: a file cannot be written.
    """
    source = spans if isinstance(spans, SpanSource) else SpanSource.of_table(spans)
    limit = int(split_mb * 1e6) if split_mb else None
    done: list[ChromeExport] = []
    with tempfile.TemporaryDirectory(prefix="chiptrace-chrome-") as spill:
        files = write_series(
            path, limit, lambda out: done.append(_Writer(source, out, Path(spill)).run())
        )
    result = done[0]
    result.files = files
    if len(files) > 1:
        log.warning(
            "chiptrace: the Chrome JSON passes --split-mb %g (chrome://tracing fails past about "
            "256 MB): wrote %d files, %s to %s, each a window of time",
            split_mb,
            len(files),
            files[0].name,
            files[-1].name,
        )
    return result
