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
from chiptrace.store import write_atomic

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
