"""Context copies across the files of one Jaeger import: each span stored once.

A Jaeger JSON export cut into pieces (`export --split-mb`) repeats, in each piece after the
first, the ancestors of its spans as copies tagged `chiptrace.context`, so that every piece
is one tree on its own. Imported together, the pieces would store those ancestors twice. So
an import holds every copy back until all of its files are read, then stores one copy of a
span only where the span itself was in none of them: the pieces imported together give the
exported spans exactly, and a piece imported alone keeps its tree.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from chiptrace.importers.plan import FileFacts

CONTEXT_TAG = "chiptrace.context"  # written by exporters/jaeger.py
_MASK = (1 << 64) - 1


def _key(trace: bytes, span: int) -> int:
    # Within one process (one import) the hash is stable; 64 bits keep the spans read at
    # 8 bytes each, and two (trace, span) pairs share a key with odds near 2**-64.
    return hash((trace, span)) & _MASK


class ContextCopies:
    """The context copies held back, and the keys of the real spans read so far."""

    def __init__(self) -> None:
        self._real: list[np.ndarray] = []
        self._held: dict[tuple[bytes, int], tuple[FileFacts, dict[str, Any]]] = {}

    def take(self, span: dict[str, Any], facts: FileFacts) -> bool:
        """Hold `span` back if it is a context copy (True), else leave it to the caller."""
        if span["attributes"].get(CONTEXT_TAG) is not True:
            return False
        key = (span["trace"], span["span"])
        if key in self._held:
            _skipped(facts, "repeated context copy")
        else:
            self._held[key] = (facts, span)
        return True

    def saw(self, spans: list[dict[str, Any]]) -> None:
        """Real spans about to be stored."""
        keys = (_key(s["trace"], s["span"]) for s in spans)
        self._real.append(np.fromiter(keys, np.uint64, len(spans)))

    def finish(self) -> list[tuple[FileFacts, list[dict[str, Any]]]]:
        """The copies to store (their span was in no file), grouped by the file they came
        from; the others are counted in their file's skipped events."""
        if not self._held:
            return []
        held = list(self._held.values())
        keys = np.fromiter((_key(s["trace"], s["span"]) for _, s in held), np.uint64, len(held))
        real = np.concatenate(self._real) if self._real else np.zeros(0, np.uint64)
        imported = np.isin(keys, real)
        by_file: dict[int, tuple[FileFacts, list[dict[str, Any]]]] = {}
        for (facts, span), dup in zip(held, imported.tolist(), strict=True):
            if dup:
                _skipped(facts, "context copy of an imported span")
            else:
                by_file.setdefault(id(facts), (facts, []))[1].append(span)
        self._held.clear()
        return list(by_file.values())


def _skipped(facts: FileFacts, why: str) -> None:
    skipped = facts.tally.setdefault("skipped", {})
    skipped[why] = skipped.get(why, 0) + 1
