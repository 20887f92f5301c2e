"""Chrome Trace Event JSON (chrome://tracing, Perfetto, chiptrace's own export) -> spans.

Complete (`X`) events and `B`/`E` pairs (matched per thread) become spans, nested per
thread. When an event's args carry `span_id` (chiptrace's `export --format chrome` writes
`trace_id`, `span_id`, `parent_span_id`, `service`, `status` and every attribute there),
those ids, parents, service and attributes are used as they are, and times are taken from
the file's `otherData.t0_unix_ns`: a chiptrace export imports back to the same spans.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import msgspec
import numpy as np
import pyarrow as pa

from chiptrace.importers import async_events as asy
from chiptrace.importers import events as ev
from chiptrace.importers.plan import ROLE_CPU, Block, FileFacts
from chiptrace.importers.source import TraceEventStream
from chiptrace.importers.spans import columns_of
from chiptrace.importers.writer import write_spill
from chiptrace.schema import dumps

_ANY = msgspec.json.Decoder(list[Any])
_ASYNC = ("b", "e", "S", "T", "p", "F")  # nestable and legacy async: see async_events
_RESERVED = ("trace_id", "span_id", "parent_span_id", "service", "status", "links")


class ChromeReader:
    """Reads one Chrome trace into span blocks; `facts` is complete after `blocks()`."""

    format = "chrome"

    def __init__(self, path: str) -> None:
        self.stream = TraceEventStream(path, ev.Event)
        self.facts = FileFacts(path=str(path), format=self.format)
        self.tally = ev.Tally()
        self._open: dict[tuple[Any, Any], list[ev.Event]] = {}
        self._threads: dict[tuple[Any, ...], int] = {}  # (pid, tid) or an async track
        self._process: dict[Any, str] = {}
        self._resource: dict[Any, dict[str, Any]] = {}  # pid -> host, service, resource
        self._async = asy.AsyncSpans(self.tally)
        self._last = 0.0  # the latest timestamp (or end) seen: where open async spans end

    def blocks(self, spill_for: Callable[[int], str], pool: Any = None) -> Iterator[Block]:
        """The file's blocks, their static columns staged in `spill_for(block number)`
        (mapped here: B/E pairs span blocks, so `pool` is not used)."""
        cats: dict[str, int] = {}
        no = -1
        for no, events in enumerate(self.stream):
            self.facts.events += len(events)
            others: list[ev.Event] = []
            rows = ev.split_block(events, self.tally, others)
            if len(rows):
                last = np.max(np.add(rows.ts, rows.dur))
                self._last = max(self._last, float(last))
            paired = self._others(others)
            block = self._rows_block(rows, paired, self._async.drain(), cats)
            if block is not None:
                yield self._staged(block, spill_for(no))
        # Slices still open at the end of the input end at its last timestamp, as Perfetto
        # draws a slice that "did not end" to the end of the trace.
        opened = self._async.finish(self._last)
        if opened:
            self.stream.warnings.append(
                f"{opened} async spans never ended (b without e, S without F): "
                "they end at the file's last timestamp, as Perfetto draws them"
            )
        unended = self._unended()
        if unended:
            self.stream.warnings.append(
                f"{len(unended)} slices never ended (B without E): "
                "they end at the file's last timestamp, as Perfetto draws them"
            )
        if opened or unended:
            block = self._rows_block(
                ev.split_block([], self.tally, []), unended, self._async.drain(), cats
            )
            if block is not None:
                yield self._staged(block, spill_for(no + 1))
        other = self.stream.header.get("otherData")
        if isinstance(other, dict) and isinstance(other.get("t0_unix_ns"), int):
            self.facts.base_ns = other["t0_unix_ns"]
        service = next(iter(self._process.values()), "chrome")
        self.facts.resource = {"service.name": service}
        self.facts.service = service
        self.facts.categories = cats
        self.facts.tally = self.tally.as_dict()

    def _rows_block(
        self,
        rows: ev.Rows,
        paired: list[ev.Event],
        done: list[asy.Done],
        cats: dict[str, int],
    ) -> Block | None:
        """One block of the file's complete events, B/E pairs and ended async spans (last)."""
        if paired or done:
            rows = _extend(rows, paired + [d[0] for d in done])
        if not len(rows):
            return None
        for c in rows.cat:
            cats[c] = cats.get(c, 0) + 1
        return self._block(rows, [(d[1], d[2]) for d in done])

    @staticmethod
    def _staged(block: Block, spill: str) -> Block:
        block.spill = spill
        write_spill(block.spill, block.static)
        block.static = None
        return block

    def _unended(self) -> list[ev.Event]:
        """Each `B` still open, as a complete event up to the file's last timestamp."""
        out = [_complete(b, max(self._last, b.ts)) for stack in self._open.values() for b in stack]
        self._open.clear()
        return out

    def _others(self, others: list[ev.Event]) -> list[ev.Event]:
        """Metadata and flows are counted; B/E pairs become complete events."""
        done: list[ev.Event] = []
        t = self.tally
        for e in others:
            if e.ph in ("B", "E"):
                self._last = max(self._last, e.ts)
            if e.ph == "B":
                self._open.setdefault((e.pid, e.tid), []).append(e)
            elif e.ph == "E":
                stack = self._open.get((e.pid, e.tid))
                if not stack:
                    t.skipped["E without B"] += 1
                    continue
                done.append(_complete(stack.pop(), e.ts))
            elif e.ph == "M":
                t.metadata += 1
                if e.name == "process_name":
                    args = _ANY.decode(b"[" + (bytes(e.args) or b"{}") + b"]")[0]
                    args = args if isinstance(args, dict) else {}
                    if isinstance(args.get("name"), str):
                        self._process.setdefault(e.pid, args["name"])
                    # Each span gets its own process's resource: chiptrace's export
                    # writes it whole; other files name the process only.
                    if isinstance(args.get("resource"), dict):
                        self._resource.setdefault(e.pid, args)
                    elif isinstance(args.get("name"), str):
                        res = {"service.name": args["name"], "process.pid": e.pid}
                        self._resource.setdefault(e.pid, {"resource": res})
            elif e.ph in _ASYNC:
                self._async.add(e)
                self._last = max(self._last, e.ts)
            elif e.ph in ("s", "t", "f"):
                t.flows += 1
            else:
                t.skipped[f"ph={e.ph or '?'}"] += 1
        return done

    def _block(self, rows: ev.Rows, tracks: list[tuple[asy.Track, str]]) -> Block:
        """`tracks`: the async track and id of the last rows (async spans), one each."""
        n = len(rows)
        first_async = n - len(tracks)
        pid, tid = ev.id_ints(list(rows.pid))[0], ev.id_ints(list(rows.tid))[0]
        start = ev.us_to_ns(rows.ts)
        end = start + np.rint(np.asarray(rows.dur, np.float64) * 1000).astype(np.int64)
        args = _ANY.decode(b"[" + b",".join(bytes(a) or b"{}" for a in rows.args) + b"]")
        spans: list[dict[str, Any]] = []
        ids: dict[str, Any] = {
            "trace": [],
            "span": np.zeros(n, np.uint64),
            "parent": np.zeros(n, np.uint64),
        }
        for i, a in enumerate(args):
            a = a if isinstance(a, dict) else {}
            attrs = {k: v for k, v in a.items() if k not in _RESERVED}
            status = str(a.get("status", ""))
            code, _, msg = status.partition(": ")
            spans.append(
                {
                    "name": rows.name[i],
                    "attributes": attrs
                    if "span_id" in a
                    else {"chrome.cat": rows.cat[i], "thread.id": rows.tid[i], **attrs},
                    "service": a.get("service") or self._process.get(rows.pid[i]),
                    "status_code": 2 if code == "ERROR" else 0,
                    "status_message": msg or None,
                    "links": a.get("links") if isinstance(a.get("links"), list) else None,
                }
            )
            if i >= first_async:
                spans[-1]["attributes"]["chrome.async_id"] = tracks[i - first_async][1]
            ids["trace"].append(_hex_bytes(a.get("trace_id"), 16))
            ids["span"][i] = _hex_int(a.get("span_id"))
            ids["parent"][i] = _hex_int(a.get("parent_span_id"))
        cols: dict[str, list[Any]] = columns_of(spans)
        cols["links"] = [dumps(sp["links"]) if sp["links"] else None for sp in spans]
        if self._resource:
            procs = [self._resource.get(p, {}) for p in rows.pid]
            cols["resource"] = [dumps(p["resource"]) if p else None for p in procs]
            cols["host"] = [p.get("host") or None for p in procs]
        columns = {k: pa.array(v) for k, v in cols.items() if any(x is not None for x in v)}
        columns["pid"] = pa.array(np.clip(pid, 0, (1 << 31) - 1), pa.int32())
        static = ev.static_batch(columns, n)
        keys: list[tuple[Any, ...]] = [(int(p), int(t)) for p, t in zip(pid, tid, strict=True)]
        keys[first_async:] = [track for track, _ in tracks]
        thread = np.array([self._threads.setdefault(k, len(self._threads)) for k in keys], np.int64)
        none = np.full(n, -1, np.int64)
        role = np.full(n, ROLE_CPU, np.int8)
        return Block(static, start, end, thread, role, none, none.copy(), ids=ids)


def _extend(rows: ev.Rows, extra: list[ev.Event]) -> ev.Rows:
    more = list(map(ev.FIELDS, extra))
    _, cat, name, pid, tid, ts, dur, args = zip(*more, strict=True)
    return ev.Rows(
        rows.cat + cat,
        rows.name + name,
        rows.pid + pid,
        rows.tid + tid,
        rows.ts + ts,
        rows.dur + dur,
        rows.args + args,
    )


def _hex_int(value: Any) -> int:
    try:
        return int(value, 16) & ((1 << 64) - 1) if isinstance(value, str) and value else 0
    except ValueError:
        return 0


def _hex_bytes(value: Any, size: int) -> bytes | None:
    try:
        return (
            bytes.fromhex(value.rjust(size * 2, "0"))[-size:]
            if isinstance(value, str) and value
            else None
        )
    except ValueError:
        return None


def _complete(b: ev.Event, end_ts: float) -> ev.Event:
    """A `B` event as the complete (`X`) event it opened, ending at `end_ts`."""
    return ev.Event("X", b.cat, b.name, b.pid, b.tid, b.ts, end_ts - b.ts, args=b.args)
