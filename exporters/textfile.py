"""Writing an export file: streamed, and all or nothing.

The file exporters write as they read (a 10M-span trace never sits in memory as Python
objects); a failure or an interrupt halfway must not leave a half-written file that the
Jaeger UI or Perfetto then half-loads, so a regular file is written under a temporary name
and renamed into place (chiptrace.store.write_atomic). `-`, /dev/stdout or any other
non-regular target is written directly.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

from chiptrace.errors import ChiptraceError
from chiptrace.store import commit_temp, temp_path, write_atomic

_BUFFER = 1 << 20


def _is_stream(path: Path) -> bool:
    try:
        return path.exists() and not path.is_file()
    except OSError:
        return False


def write_text(path: str | os.PathLike[str], write: Callable[[TextIO], None]) -> None:
    """Call write(fh) with a buffered text file for `path`; rename into place on success.

    Raises:
        ChiptraceError: the file cannot be written (the message names it).
    """
    try:
        if str(path) == "-":
            write(sys.stdout)
            sys.stdout.flush()
            return
        target = Path(path)
        if _is_stream(target):
            with open(target, "w", encoding="utf-8", buffering=_BUFFER) as fh:
                write(fh)
            return

        def to_tmp(tmp: Path) -> None:
            with open(tmp, "w", encoding="utf-8", buffering=_BUFFER) as fh:
                write(fh)

        write_atomic(target, to_tmp)
    except OSError as e:
        raise ChiptraceError(f"cannot write {path}: {e.strerror or e}") from e


class TextSeries:
    """One export document, or a series of them when one would pass `limit` characters.

    `NAME.json` when the writer never calls `next()`, else `NAME-001.json`,
    `NAME-002.json`, ... beside it. Every file is written under a temporary name and all
    are renamed into place once the last is complete, so a failure leaves none. `-` and
    other non-regular targets get one document, never split.

    Args:
        path: the target as given with -o.
        limit: characters per file before `full()` says so (None: no limit).
    """

    def __init__(self, path: str | os.PathLike[str], limit: int | None) -> None:
        self.path = Path(path)
        self._stream = str(path) == "-" or _is_stream(self.path)
        self.limit = None if self._stream else limit
        self.size = 0  # characters in the current file
        self.total = 0  # characters in all files
        self._temps: list[Path] = []
        self._held: list[TextIO] = []  # files kept open by hold() for more at their end
        self.fh: TextIO | None = None

    def open(self) -> None:
        """Start the first file, or the next one after `close_file()` or `hold()`."""
        self.size = 0
        if self._stream:
            if str(self.path) == "-":
                self.fh = sys.stdout
            else:
                self.fh = open(self.path, "w", encoding="utf-8", buffering=_BUFFER)  # noqa: SIM115
            return
        tmp = temp_path(self.path)
        self._temps.append(tmp)
        self.fh = open(tmp, "w", encoding="utf-8", buffering=_BUFFER)  # noqa: SIM115

    def write(self, text: str) -> None:
        if self.fh is None:
            raise RuntimeError("TextSeries.write before open()")  # a caller's bug, not data
        self.fh.write(text)
        self.size += len(text)
        self.total += len(text)

    def full(self, coming: int = 0) -> bool:
        """Whether the current file is at its limit, or would pass it with `coming` more."""
        return self.limit is not None and self.size + coming > self.limit

    def hold(self) -> None:
        """Keep the current file open (for `resume`) and start none yet: a writer that
        ends each file with what it knows only when every file is written."""
        if self.fh is not None:
            self._held.append(self.fh)
            self.fh = None

    def resume(self, index: int) -> None:
        """Go back to held file `index` (0-based, in the order they were held)."""
        self.fh = self._held[index]

    def close_file(self) -> None:
        fh, self.fh = self.fh, None
        if fh is None:
            return
        if fh is sys.stdout:
            fh.flush()
        else:
            fh.close()

    def names(self) -> list[Path]:
        """The files this series becomes: NAME.json alone, else NAME-001.json, ..."""
        if self._stream or len(self._temps) <= 1:
            return [self.path]
        return [
            self.path.with_name(f"{self.path.stem}-{i:03d}{self.path.suffix}")
            for i in range(1, len(self._temps) + 1)
        ]

    def _close_held(self) -> None:
        held, self._held = self._held, []
        for fh in held:
            if fh is not self.fh and fh is not sys.stdout:
                fh.close()

    def commit(self) -> list[Path]:
        self._close_held()
        self.close_file()
        names = self.names()
        if not self._stream:
            for tmp, name in zip(self._temps, names, strict=True):
                commit_temp(tmp, name)
        return names

    def abort(self) -> None:
        try:
            self._close_held()
            self.close_file()
        finally:
            for tmp in self._temps:
                tmp.unlink(missing_ok=True)


def write_series(
    path: str | os.PathLike[str], limit: int | None, write: Callable[[TextSeries], None]
) -> list[Path]:
    """Call write(series) and put its files in place; returns their paths.

    Raises:
        ChiptraceError: a file cannot be written (the message names it).
    """
    series = TextSeries(path, limit)
    try:
        series.open()
        write(series)
        return series.commit()
    except OSError as e:
        series.abort()
        raise ChiptraceError(f"cannot write {path}: {e.strerror or e}") from e
    except BaseException:
        series.abort()
        raise
