"""Span sites and tag sets: the constant part of a span, interned by value, numbered once.

A decorated function, or a `span("name", chip=...)` call site, produces spans that differ
only in ids and times. The row it buffers carries the site's small number instead of the
name and the Tags object, so a row is a tuple of ints (which the garbage collector stops
tracking), and the writer thread turns the site numbers into columns with one NumPy take
per column (chiptrace.recording.fastrows) instead of a Python loop per span.

Tags are interned by their four strings (`tags`): the same chip/link/op/precision is the
same Tags object however many spans name it, so a site keyed by the Tags' identity is a
site keyed by value, and cycling the 5,112 link ids of a 72-GPU rack costs what 100 do
once each has been seen. Both tables are bounded (MAX_TAGS, MAX_SITES). Past MAX_TAGS a
new tag set is not parsed on the program's thread at all: it travels as `RawTags` (its
four strings) in a general row, and the writer checks it where it converts the row (a bad
one costs its span, counted, instead of a ChipError at the call), so the overflow path
costs what a known site does. Past MAX_SITES a span carries its name in a general row.

Free threading: every write to the tables happens under `_lock`, and readers without the
lock only ever look a key up in `_index`/`_by_value`, which is published last: a reader
that finds a number finds the list entries behind it (list appends and dict stores are
atomic in CPython with or without the GIL: per-object locks in the free-threaded build).
"""

from __future__ import annotations

import os
import threading
from typing import Any

from chiptrace.vocab import NO_TAGS, Tags

# Names made per call (f"step {i}") would grow the tables without end. 131,072 holds the
# 100,000 distinct link ids of the largest racks chiptrace models, at ~0.5 KB each.
MAX_SITES = 1 << 17
MAX_TAGS = 1 << 17

_lock = threading.Lock()
_index: dict[tuple[str, int, int], int] = {}
NAMES: list[str] = []
KINDS: list[int] = []
TAGS: list[Tags] = []  # keeps each Tags alive, so the id() in _index stays its own
_by_value: dict[tuple[str | None, str | None, str | None, str | None], Tags] = {
    (None, None, None, None): NO_TAGS
}


class RawTags(tuple):
    """Tags not yet checked, for a full table: `(key,)`, key the plain tuple (chip, link,
    op, precision). The span's row carries the key, not this object: the garbage collector
    stops tracking a plain tuple of strings, and then the row holding it, but never an
    instance of a tuple subclass, which would keep a million buffered rows in its scans.
    The writer checks the key (`check`) where it converts the row."""

    __slots__ = ()
    attributes = None  # only a decorator's Tags carry static attributes

    def checked(self) -> Tags:
        """The Tags these values name.

        Raises:
            ChipError: an unknown chip, link, op kind or precision.
        """
        return check(self[0])

    def __getattr__(self, name: str) -> Any:  # chip_type etc., for the rare reader
        return getattr(self.checked(), name)


def tags(chip: str | None, link: str | None, op: str | None, precision: str | None) -> Tags:
    """The one Tags object of these values (checked once, when first seen); a `RawTags`
    once the table is full (see the module doc).

    Raises:
        ChipError: an unknown chip, link, op kind or precision (while the table has room).
    """
    key = (chip, link, op, precision)
    found = _by_value.get(key)
    if found is not None:
        return found
    if len(_by_value) >= MAX_TAGS:
        return RawTags((key,))  # type: ignore[return-value]
    built = Tags.build(chip=chip, link=link, op=op, precision=precision)
    with _lock:
        return _by_value.setdefault(key, built)


def check(key: tuple[Any, ...]) -> Tags:
    """The Tags of a RawTags' key (chip, link, op, precision), on the writer.

    Raises:
        ChipError: an unknown chip, link, op kind or precision.
    """
    return Tags.build(chip=key[0], link=key[1], op=key[2], precision=key[3])


def site(name: Any, tags: Tags, kind: int) -> int:
    """The number of the site (name, tags, kind); -1 when it cannot have one (a name
    that is not a string, or a full table): such spans write the general row."""
    if name.__class__ is not str:
        return -1  # checked first: a name that is not hashable must not raise here
    key = (name, id(tags), kind)
    found = _index.get(key)
    if found is not None:
        return found
    if len(NAMES) >= MAX_SITES or tags.__class__ is RawTags:
        return -1
    with _lock:
        found = _index.get(key)
        if found is None:
            found = len(NAMES)
            NAMES.append(name)
            KINDS.append(kind)
            TAGS.append(tags)
            _index[key] = found  # published last: a reader that finds it finds its data
    return found


def snapshot(start: int) -> tuple[list[str], list[int], list[Tags]]:
    """Names, kinds and tags of sites start.. as they are now, read under the lock (three
    lists appended one after another are consistent only there)."""
    with _lock:
        n = len(NAMES)
        return NAMES[start:n], KINDS[start:n], TAGS[start:n]


def _after_fork_in_child() -> None:
    """A fork while another thread held the lock would leave the child's copy held, and
    that thread, gone in the child, may have been between site()'s three appends: cut
    the lists to the sites they all hold (the half-added one has no `_index` entry yet,
    which is published last), or every later site's name would sit beside another's
    kind and tags."""
    global _lock
    _lock = threading.Lock()
    n = min(len(NAMES), len(KINDS), len(TAGS))
    del NAMES[n:], KINDS[n:], TAGS[n:]


os.register_at_fork(after_in_child=_after_fork_in_child)
