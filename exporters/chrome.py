"""Chrome Trace Event Format JSON, which Perfetto (ui.perfetto.dev) and chrome://tracing open.

Layout: one process per host; in it one track (thread) per chip, per link and, for spans
on neither, per service, named by metadata (`M`) events and sorted chips first (in
CHIP_TYPES order), then links. Spans are complete (`X`) events with their ids and
attributes as args; span events are thread-scoped instants. A track's slices must nest
strictly, so spans that overlap on one chip without nesting (two streams, two threads)
go to sub-tracks named `gpu:0 #2`, `gpu:0 #3`, ... Flow events (`s`/`f`) run from each
transfer to the op it feeds: a span linked to a transfer span (the `links` column), or a
span whose parent is a transfer.

Times are microseconds from the first span's start (the file's `otherData.t0_unix_ns`),
printed to the nanosecond: Unix-epoch microseconds as doubles would lose the nanoseconds.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from typing import Any

import pyarrow as pa
from chiptrace.exporters import attributes as A

from chiptrace.errors import ChiptraceError
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
    lanes: list[list[int]] = []  # per lane, the end times of the open (enclosing) slices
    out: dict[int, int] = {}
    for start, end, key in sorted(spans, key=lambda s: (s[0], -s[1])):
        for i, stack in enumerate(lanes):
            while stack and stack[-1] <= start:
                stack.pop()
            if not stack or stack[-1] >= end:
                stack.append(end)
                out[key] = i
                break
        else:
            lanes.append([end])
            out[key] = len(lanes) - 1
    return out


def _us(ns: int) -> float:
    return round(ns / 1000, 3)


class _Builder:
    def __init__(self, rows: list[dict[str, Any]]) -> None:
        self.rows = rows
        self.t0 = min((r["start_ns"] for r in rows), default=0)
        self.events: list[dict[str, Any]] = []
        self.where: dict[str, tuple[int, int, dict[str, Any]]] = {}  # span id -> pid, tid, row

    def build(self) -> list[dict[str, Any]]:
        hosts = sorted({r.get("host") or "host" for r in self.rows})
        pids = {h: i + 1 for i, h in enumerate(hosts)}
        for h, pid in pids.items():
            self.events.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": h}})
            self.events.append({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "args": {"sort_index": pid}})
        tracks: dict[tuple[str, tuple[int, str, str]], list[int]] = {}
        for i, r in enumerate(self.rows):
            tracks.setdefault((r.get("host") or "host", _track_key(r)), []).append(i)
        tid = 0
        for (host, key), idx in sorted(tracks.items(), key=lambda kv: (kv[0][0], kv[0][1][:2])):
            lanes = assign_lanes([(self.rows[i]["start_ns"], self.rows[i]["end_ns"], i) for i in idx])
            tids = {}
            for lane in range(max(lanes.values()) + 1):
                tid += 1
                tids[lane] = tid
                name = key[2] if lane == 0 else f"{key[2]} #{lane + 1}"
                self.events.append({"ph": "M", "name": "thread_name", "pid": pids[host], "tid": tid, "args": {"name": name}})
                self.events.append({"ph": "M", "name": "thread_sort_index", "pid": pids[host], "tid": tid, "args": {"sort_index": tid}})
            for i in idx:
                self._slice(self.rows[i], pids[host], tids[lanes[i]])
        self._flows()
        return self.events

    def _slice(self, row: dict[str, Any], pid: int, tid: int) -> None:
        args: dict[str, Any] = {
            "trace_id": A.hex_id(row["trace_id"]),
            "span_id": A.hex_id(row["span_id"]),
        }
        if row.get("parent_span_id") is not None:
            args["parent_span_id"] = A.hex_id(row["parent_span_id"])
        if row.get("service"):
            args["service"] = row["service"]
        args.update(A.attributes(row))
        if row.get("status_code") == 2:
            args["status"] = "ERROR" + (f": {row['status_message']}" if row.get("status_message") else "")
        self.events.append({
            "ph": "X", "name": row["name"], "cat": row.get("op_kind") or "span",
            "ts": _us(row["start_ns"] - self.t0), "dur": _us(row["end_ns"] - row["start_ns"]),
            "pid": pid, "tid": tid, "args": args,
        })  # fmt: skip
        for ev in A.events(row):
            self.events.append({
                "ph": "i", "s": "t", "name": str(ev.get("name", "")), "pid": pid, "tid": tid,
                "ts": _us(int(ev.get("time_ns", row["start_ns"])) - self.t0),
                "args": ev.get("attributes") or {},
            })  # fmt: skip
        self.where[args["span_id"]] = (pid, tid, row)

    def _flows(self) -> None:
        flow_id = 0
        for span_id, (pid, tid, row) in self.where.items():
            sources = [lk["span_id"] for lk in A.links(row)]
            if row.get("parent_span_id") is not None:
                parent = A.hex_id(row["parent_span_id"])
                if parent in self.where and self.where[parent][2].get("link_id"):
                    sources.append(parent)
            for src in sources:
                if src not in self.where or src == span_id:
                    continue
                spid, stid, srow = self.where[src]
                if not srow.get("link_id") and not row.get("link_id"):
                    continue  # flows show data movement: one end must be a transfer
                flow_id += 1
                # "s" binds to the slice enclosing its ts: the transfer's last nanosecond.
                s_ts = max(srow["start_ns"], srow["end_ns"] - 1)
                self.events.append({"ph": "s", "id": flow_id, "name": "feeds", "cat": "flow",
                                    "pid": spid, "tid": stid, "ts": _us(s_ts - self.t0)})
                self.events.append({"ph": "f", "bp": "e", "id": flow_id, "name": "feeds", "cat": "flow",
                                    "pid": pid, "tid": tid, "ts": _us(row["start_ns"] - self.t0)})


def to_chrome(rows: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """A Trace Event Format document (JSON object form) from span rows."""
    rows = list(rows)
    builder = _Builder(rows)
    events = builder.build()
    return {
        "traceEvents": events,
        "displayTimeUnit": "ns",
        "otherData": {"generator": "chiptrace", "t0_unix_ns": builder.t0, "spans": len(rows)},
    }


def write_chrome_json(table: pa.Table, path: str | os.PathLike[str]) -> int:
    """Write spans as Chrome/Perfetto JSON; returns the number of slices written.

    Raises:
        ChiptraceError: the file cannot be written.
    """
    doc = to_chrome(table.to_pylist())
    try:
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(json.dumps(doc, separators=(",", ":")))  # one-shot: the C encoder, ~3x faster
    except OSError as e:
        raise ChiptraceError(f"cannot write {path}: {e.strerror}") from e
    return doc["otherData"]["spans"]
