"""Async Trace Events -> spans, read the way Perfetto's and catapult's JSON importers read them.

- Nestable async (`b`/`e`): one track per (cat, id), `id2.global` taken like `id` and
  `id2.local` per process, as Perfetto's json_trace_parser keys its async tracks. A `b` opens
  a span on its track, under the innermost span still open there; an `e` ends the innermost
  open span of the same name on the track (Perfetto's SliceTracker::End), and one that ends
  none is counted as `e without b`. Async instants (`n`) are counted, like instants elsewhere.
- Legacy async (`S` ... `F` of one cat, id and name) is a span on a track of that cat, id and
  name, as catapult's importer reads it (Perfetto skips these); its steps are child spans named `name:step`: a `T` (step into) runs
  from the step to the next step or the end, a `p` (step past) from the previous step or the
  start up to it.
- Events pair in file order, but an end read before its begin (a file is not in time order:
  Chrome writes each thread's buffer in turn) waits for it, as Perfetto's sort would pair it.
- A begin still open at the end of the input ends at the file's last timestamp and is counted
  in a warning: Perfetto keeps such a slice ("did not end") and draws it to the trace's end.

Spans are handed out as soon as they end, so memory holds only the open ones. Each track is
its own nesting domain: an async span nests under the spans of its track, never under the
synchronous work of the thread that happened to write it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import msgspec

from chiptrace.importers import events as ev

Track = tuple[Any, ...]
_EARLY_MAX = 256  # ends kept waiting for their begin, per track and name
# A finished span: the complete (`X`) event, its track, its async id.
Done = tuple[ev.Event, Track, str]


@dataclass
class _Begin:
    event: ev.Event
    end: float | None = None
    steps: list[ev.Event] = field(default_factory=list)


def track_of(e: ev.Event) -> tuple[Track, str] | None:
    """The async track of an event and its id's text, or None when it has no id."""
    if e.id is not None and e.id != "":
        return ("async", e.cat, str(e.id)), str(e.id)
    id2 = e.id2 if isinstance(e.id2, dict) else {}
    if id2.get("global") not in (None, ""):
        return ("async", e.cat, str(id2["global"])), str(id2["global"])
    if id2.get("local") not in (None, ""):
        return ("async-local", e.pid, e.cat, str(id2["local"])), str(id2["local"])
    return None


class AsyncSpans:
    """Pairs a file's async events into spans, across blocks; see the module docstring."""

    def __init__(self, tally: ev.Tally) -> None:
        self.tally = tally
        self._nestable: dict[Track, list[_Begin]] = {}
        self._legacy: dict[Track, list[_Begin]] = {}
        # Ends read before their begin, by ("e" or "F", *track, name): a file is not in time
        # order (Chrome writes each thread's buffer in turn) and Perfetto sorts it first.
        self._early: dict[Track, list[ev.Event]] = {}
        self._done: list[Done] = []

    def add(self, e: ev.Event) -> None:
        """One `b`, `e`, `S`, `T`, `p` or `F` event."""
        found = track_of(e)
        if found is None:
            self.tally.skipped[f"ph={e.ph} without id"] += 1
        elif e.ph in ("b", "e"):
            self._add_nestable(e, found[0])
        else:
            self._add_legacy(e, found[0])

    def drain(self) -> list[Done]:
        """The spans that ended since the last call."""
        done, self._done = self._done, []
        return done

    def finish(self, last_ts: float) -> int:
        """End every span still open at `last_ts`; how many there were."""
        opened = 0
        for key, stack in self._nestable.items():
            for b in stack:
                if b.end is None:
                    self._emit(b, None, key, max(last_ts, b.event.ts))
                    opened += 1
        for key, stack in self._legacy.items():
            for b in stack:
                self._emit(b, None, key, max(last_ts, b.event.ts))
                opened += 1
        for key, ends in self._early.items():
            self.tally.skipped["e without b" if key[0] == "e" else "F without S"] += len(ends)
        self._nestable.clear()
        self._legacy.clear()
        self._early.clear()
        return opened

    def _add_nestable(self, e: ev.Event, key: Track) -> None:
        if e.ph == "b":
            early = self._early_end(e, ("e", *key, e.name))
            if early is not None:
                self._emit(_Begin(e), early, key)
            else:
                self._nestable.setdefault(key, []).append(_Begin(e))
            return
        stack = self._nestable.setdefault(key, [])
        for b in reversed(stack):
            if b.end is None and b.event.name == e.name:
                b.end = e.ts
                self._emit(b, e, key)
                break
        else:
            self._wait(("e", *key, e.name), e)
        # Ended spans leave the stack once nothing open sits above them (their children
        # may still be open: Perfetto keeps those nested under them).
        while stack and stack[-1].end is not None:
            stack.pop()
        if not stack:
            del self._nestable[key]

    def _add_legacy(self, e: ev.Event, key: Track) -> None:
        named = (*key, e.name)
        if e.ph == "S":
            early = self._early_end(e, ("F", *named))
            if early is not None:
                self._emit(_Begin(e), early, named)
            else:
                self._legacy.setdefault(named, []).append(_Begin(e))
            return
        stack = self._legacy.get(named)
        if not stack and e.ph == "F":
            self._wait(("F", *named), e)
            return
        if not stack:
            self.tally.skipped[f"{e.ph} without S"] += 1
            return
        if e.ph in ("T", "p"):
            stack[-1].steps.append(e)
            return
        b = stack.pop()
        if not stack:
            del self._legacy[named]
        self._emit(b, e, named)

    def _wait(self, key: Track, end: ev.Event) -> None:
        """Keep an end that ends nothing yet for a begin written after it (a bounded number
        per track and name, so a file of stray ends costs no quadratic search)."""
        ends = self._early.setdefault(key, [])
        if len(ends) < _EARLY_MAX:
            ends.append(end)
        else:
            self.tally.skipped["e without b" if key[0] == "e" else "F without S"] += 1

    def _early_end(self, begin: ev.Event, key: Track) -> ev.Event | None:
        """The end read before `begin` that ends it: the earliest at or after its start."""
        ends = self._early.get(key)
        if not ends:
            return None
        fits = [j for j, x in enumerate(ends) if x.ts >= begin.ts]
        if not fits:
            return None
        end = ends.pop(min(fits, key=lambda j: ends[j].ts))
        if not ends:
            del self._early[key]
        return end

    def _emit(self, b: _Begin, e: ev.Event | None, key: Track, at: float = 0.0) -> None:
        """The span of `b`, ended by `e` (its args added to the begin's, as Perfetto adds
        an end's args to its slice) or, with no end event, at `at`."""
        s = b.event
        end = e.ts if e is not None else at
        args = _merged(s.args, e.args) if e is not None else s.args
        async_id = _id_text(s)
        self._done.append((_complete(s, s.name, s.ts, end, args), key, async_id))
        marks = [s.ts] + [t.ts for t in b.steps] + [end]
        for i, t in enumerate(b.steps, start=1):
            name = f"{s.name}:{_step(t)}"
            lo, hi = (marks[i], marks[i + 1]) if t.ph == "T" else (marks[i - 1], marks[i])
            self._done.append((_complete(s, name, lo, hi, t.args), key, async_id))


def _complete(s: ev.Event, name: str, start: float, end: float, args: msgspec.Raw) -> ev.Event:
    return ev.Event("X", s.cat, name, s.pid, s.tid, start, max(end - start, 0.0), args=args)


def _id_text(e: ev.Event) -> str:
    found = track_of(e)
    return found[1] if found else ""


def _args(raw: msgspec.Raw) -> dict[str, Any]:
    try:
        args = msgspec.json.decode(bytes(raw))
    except msgspec.DecodeError:
        return {}
    return args if isinstance(args, dict) else {}


def _merged(begin: msgspec.Raw, end: msgspec.Raw) -> msgspec.Raw:
    """The begin's args with the end's added (an end's value wins): most ends carry none."""
    extra = _args(end)
    if not extra:
        return begin
    return msgspec.Raw(msgspec.json.encode({**_args(begin), **extra}))


def _step(e: ev.Event) -> str:
    return str(_args(e.args).get("step", "?"))
