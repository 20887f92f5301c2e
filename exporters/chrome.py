"""Chrome Trace Event Format JSON, which Perfetto (ui.perfetto.dev) and chrome://tracing open.

Layout: one process per host; in it one track (thread) per chip, per link and, for spans
on neither, per service, named by metadata (`M`) events and sorted chips first (in
CHIP_TYPES order), then links. Spans are complete (`X`) events with their ids and
attributes as args; span events are thread-scoped instants. A track's slices must nest
strictly, so spans that overlap on one chip without nesting (two streams, two threads)
go to sub-tracks named `gpu:0 #2`, `gpu:0 #3`, ... Flow events (`s`/`f`) join every span
link (the `links` column), drawn forward in time, and each transfer to its child spans.

Times are microseconds from the first span's start (the file's `otherData.t0_unix_ns`),
printed to the nanosecond: Unix-epoch microseconds as doubles would lose the nanoseconds.
"""

from __future__ import annotations

import json
import os
from typing import Any, TextIO

import pyarrow as pa

from chiptrace import _attributes as A
from chiptrace.exporters.source import SpanSource
from chiptrace.exporters.textfile import write_text
from chiptrace.schema import CHIP_TYPES


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


# The track of a span, in SQL, and its display name: the chip, else the link, else the
# service (what _track_key orders in Python).
_TRACK_SQL = """CASE WHEN coalesce(chip_id, '') <> '' THEN chip_id
     WHEN coalesce(link_id, '') <> '' THEN link_id
     ELSE coalesce(nullif(service, ''), 'spans') END"""
_HOST_SQL = "coalesce(nullif(host, ''), 'host')"
# The last nanosecond inside a span (its start when it has no length).
_LAST_NS = "greatest({t}.start_ns, {t}.end_ns - 1)"

# Flow arrows: the edges (each span link; each child of a transfer), the two spans of each,
# the earlier one as the source (`fwd`), and the instants the arrow leaves and lands.
_FLOWS_SQL = f"""
WITH edges AS (
    SELECT 'parent' AS via, s.trace_id AS ta, s.parent_span_id AS a,
           s.trace_id AS tb, s.span_id AS b
    FROM selected s WHERE s.parent_span_id IS NOT NULL
    UNION ALL
    SELECT 'link', coalesce(from_hex(nullif(lk ->> 'trace_id', '')), dt),
           from_hex(lk ->> 'span_id'), dt, ds
    FROM (SELECT s.trace_id AS dt, s.span_id AS ds, unnest(json_extract(s.links, '$[*]')) AS lk
          FROM selected s WHERE s.links IS NOT NULL AND json_valid(s.links)
          AND json_type(s.links) = 'ARRAY')
    WHERE regexp_full_match(coalesce(lk ->> 'span_id', ''), '([0-9a-fA-F]{{2}})+')
      AND regexp_full_match(coalesce(lk ->> 'trace_id', ''), '(([0-9a-fA-F]{{2}})+)?')
),
pairs AS (
    SELECT e.ta, e.a, e.tb, e.b,
           x.start_ns AS a0, {_LAST_NS.format(t="x")} AS a1,
           y.start_ns AS b0, {_LAST_NS.format(t="y")} AS b1
    FROM edges e
    JOIN selected x ON x.trace_id = e.ta AND x.span_id = e.a
    JOIN selected y ON y.trace_id = e.tb AND y.span_id = e.b
    WHERE (e.ta <> e.tb OR e.a <> e.b)
      AND (e.via = 'link' OR coalesce(x.link_id, '') <> '')
),
directed AS (
    SELECT CASE WHEN fwd THEN ta ELSE tb END AS st, CASE WHEN fwd THEN a ELSE b END AS ss,
           CASE WHEN fwd THEN tb ELSE ta END AS dt, CASE WHEN fwd THEN b ELSE a END AS ds,
           CASE WHEN fwd THEN a0 ELSE b0 END AS s0, CASE WHEN fwd THEN a1 ELSE b1 END AS s1,
           CASE WHEN fwd THEN b0 ELSE a0 END AS d0, CASE WHEN fwd THEN b1 ELSE a1 END AS d1
    FROM (SELECT *, a0 <= b1 AS fwd FROM pairs)
),
timed AS (
    SELECT DISTINCT st, ss, dt, ds, greatest(s0, least(s1, d1)) AS s_ts, d0 FROM directed
)
SELECT sp.pid AS spid, sp.tid AS stid, s_ts,
       dp.pid AS dpid, dp.tid AS dtid, greatest(d0, s_ts) AS d_ts
FROM timed t
JOIN chiptrace_placed sp ON sp.trace_id = t.st AND sp.span_id = t.ss
JOIN chiptrace_placed dp ON dp.trace_id = t.dt AND dp.span_id = t.ds
ORDER BY d_ts, s_ts, dpid, dtid, spid, stid
"""


class _Writer:
    """Streams a Trace Event Format document: slices track by track in (start, -end)
    order, lanes assigned online, then flows by a join in DuckDB. Memory: one record batch
    of rows, plus (trace id, span id, pid, tid) per span in Arrow for the flow join."""

    def __init__(self, source: SpanSource, fh: TextIO) -> None:
        self.source, self.fh = source, fh
        self.t0 = 0
        self.slices = 0
        self._first = True

    def _emit(self, events: list[dict[str, Any]]) -> None:
        if events:
            # allow_nan=False: a NaN that slipped past json_safe fails here, not in Perfetto
            text = json.dumps(events, separators=(",", ":"), allow_nan=False)[1:-1]
            self.fh.write(text if self._first else "," + text)
            self._first = False

    def run(self) -> int:
        con = self.source.con
        tracks = list(
            self.source.stream(
                f"SELECT {_HOST_SQL} AS h, {_TRACK_SQL} AS track, any_value(chip_id) AS chip_id, "
                "any_value(chip_type) AS chip_type, any_value(link_id) AS link_id, "
                "any_value(service) AS service, min(start_ns) AS t0 FROM selected GROUP BY ALL"
            )
        )
        rows = pa.Table.from_batches(tracks).to_pylist() if tracks else []
        self.t0 = min((r["t0"] for r in rows), default=0)
        hosts = sorted({r["h"] for r in rows})
        pids = {h: i + 1 for i, h in enumerate(hosts)}
        meta: list[dict[str, Any]] = []
        for h, pid in pids.items():
            meta.append(
                {"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": h}}
            )
            meta.append(
                {
                    "ph": "M",
                    "name": "process_sort_index",
                    "pid": pid,
                    "tid": 0,
                    "args": {"sort_index": pid},
                }
            )
        order = sorted(rows, key=lambda r: (r["h"], _track_key(r)[:2]))
        ranks = pa.table(
            {
                "h": [r["h"] for r in order],
                "track": [r["track"] for r in order],
                "rank": list(range(len(order))),
            }
        )
        names = [_track_key(r)[2] for r in order]
        con.register("chiptrace_tracks", ranks)
        self.fh.write('{"traceEvents":[')
        self._emit(meta)
        placed = self._slices(pids, names)
        con.register("chiptrace_placed", placed)
        self._flows()
        # No displayTimeUnit: ts and dur are microseconds, the format's unit; viewers that
        # honour "ns" there would draw every span 1000x too short.
        self.fh.write(
            f'],"otherData":{{"generator":"chiptrace",'
            f'"t0_unix_ns":{self.t0},"spans":{self.slices}}}}}'
        )
        return self.slices

    def _slices(self, pids: dict[str, int], names: list[str]) -> pa.Table:
        sql = (
            f"SELECT s.*, t.rank AS _rank, t.h AS _h FROM "
            f"(SELECT *, {_HOST_SQL} AS h, {_TRACK_SQL} AS track FROM selected) s "
            "JOIN chiptrace_tracks t USING (h, track) "
            "ORDER BY t.rank, s.start_ns, s.end_ns DESC, s.span_id"
        )
        lanes: list[list[int]] = []
        tids: dict[int, int] = {}
        rank, tid = -1, 0
        placed: list[pa.Table] = []
        for batch in self.source.stream(sql):
            events: list[dict[str, Any]] = []
            batch_pids, batch_tids = [], []
            for row in batch.to_pylist():
                if row["_rank"] != rank:  # the next track: fresh lanes
                    rank, lanes, tids = row["_rank"], [], {}
                pid = pids[row["_h"]]
                lane = _place(lanes, row["start_ns"], row["end_ns"])
                if lane not in tids:
                    tid += 1
                    tids[lane] = tid
                    name = names[rank] if lane == 0 else f"{names[rank]} #{lane + 1}"
                    events.append(
                        {
                            "ph": "M",
                            "name": "thread_name",
                            "pid": pid,
                            "tid": tid,
                            "args": {"name": name},
                        }
                    )
                    events.append(
                        {
                            "ph": "M",
                            "name": "thread_sort_index",
                            "pid": pid,
                            "tid": tid,
                            "args": {"sort_index": tid},
                        }
                    )
                self._slice(events, row, pid, tids[lane])
                batch_pids.append(pid)
                batch_tids.append(tids[lane])
            self._emit(events)
            self.slices += batch.num_rows
            placed.append(
                pa.table(
                    {
                        "trace_id": batch.column("trace_id"),
                        "span_id": batch.column("span_id"),
                        "pid": pa.array(batch_pids, pa.int32()),
                        "tid": pa.array(batch_tids, pa.int32()),
                    }
                )
            )
        schema = pa.schema(
            [
                ("trace_id", pa.binary()),
                ("span_id", pa.binary()),
                ("pid", pa.int32()),
                ("tid", pa.int32()),
            ]
        )
        return pa.concat_tables(placed) if placed else schema.empty_table()

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

    def _flows(self) -> None:
        """A flow arrow for every span link, and from each transfer to its children.

        Flows run forward in time: the earlier span is the source (a link to a later span
        is drawn from the linking span), the arrow leaves the source at the latest instant
        it can and lands where the destination is running then, or at its start. "s" and
        "f" bind to the slice enclosing their ts, so both are inside their spans."""
        sql = _FLOWS_SQL
        flow_id = 0
        for batch in self.source.stream(sql):
            events: list[dict[str, Any]] = []
            for f in batch.to_pylist():
                flow_id += 1
                events.append(
                    {
                        "ph": "s",
                        "id": flow_id,
                        "name": "feeds",
                        "cat": "flow",
                        "pid": f["spid"],
                        "tid": f["stid"],
                        "ts": _us(f["s_ts"] - self.t0),
                    }
                )
                events.append(
                    {
                        "ph": "f",
                        "bp": "e",
                        "id": flow_id,
                        "name": "feeds",
                        "cat": "flow",
                        "pid": f["dpid"],
                        "tid": f["dtid"],
                        "ts": _us(f["d_ts"] - self.t0),
                    }
                )
            self._emit(events)


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


def write_chrome_json(spans: pa.Table | SpanSource, path: str | os.PathLike[str]) -> int:
    """Write spans as Chrome/Perfetto JSON, streamed; returns the number of slices written.

    Args:
        spans: a table of spans_raw columns, or a SpanSource (trace dirs and filters).
        path: the file (written under a temporary name, renamed when complete), or `-`.

    Raises:
        ChiptraceError: the file cannot be written.
    """
    source = spans if isinstance(spans, SpanSource) else SpanSource.of_table(spans)
    out: list[int] = []
    write_text(path, lambda fh: out.append(_Writer(source, fh).run()))
    return out[0]
