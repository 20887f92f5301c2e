"""Which runs the trace dirs given to `report`, `query` and `view` hold, and the errors that
show the way when what was given is not a trace dir: a trace file (import it first), a
folder of runs (give its glob), several runs (say which, or `--run ID`).

A run is what one writer session or one import stored: its manifests share a `run_id`.
Dirs given together whose manifests name one run id (a job's hosts, each writing its own
dir) are one run; dirs of different runs are reported one by one.
"""

from __future__ import annotations

import argparse
import glob
import os
from dataclasses import dataclass
from pathlib import Path

from chiptrace.errors import ChiptraceError
from chiptrace.store import MANIFEST_DIR, PART_SUFFIX, SPANS_DIR, read_manifests

# What a trace file made elsewhere looks like (what `chiptrace import` reads).
_TRACE_FILE_SUFFIXES = (".json", ".json.gz", ".jsonl", ".jsonl.gz", ".gz", ".pb", ".otlp")


@dataclass(frozen=True)
class Run:
    """One run among the dirs given: its id (or its dir's name) and its dirs."""

    id: str
    dirs: tuple[str, ...]

    def describe(self) -> str:
        return f"{self.id} ({', '.join(self.dirs)})"


def add_run_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--run",
        metavar="ID",
        help="of several runs given, the one to use: its run id (or a prefix) or its dir's name",
    )


def _is_store(path: Path) -> bool:
    return (
        (path / SPANS_DIR).is_dir()
        or (path / MANIFEST_DIR).is_dir()
        or (path.is_dir() and any(path.glob(f"*{PART_SUFFIX}")))
    )


def check_given(paths: list[str], command: str, several: bool = True) -> None:
    """Refuse, with the way out, what is not a trace dir: a trace file, a folder of runs.

    Raises:
        ChiptraceError: one line naming the path and the command to run instead.
    """
    for raw in paths:
        matches = sorted(glob.glob(raw)) if glob.has_magic(raw) else [raw]
        for m in matches:
            p = Path(m)
            if p.is_file() and not p.name.endswith(PART_SUFFIX):
                if p.name.endswith(_TRACE_FILE_SUFFIXES):
                    raise ChiptraceError(
                        f"{m} is a trace file, not a trace dir: run `chiptrace import {m} "
                        f"--out DIR` first, then `chiptrace {command} DIR`"
                    )
                raise ChiptraceError(f"{m}: expected a trace dir (a folder of Parquet parts)")
            if p.is_dir() and not _is_store(p):
                runs = sorted(c.name for c in p.iterdir() if c.is_dir() and _is_store(c))
                if runs:
                    shown = ", ".join(runs[:5]) + (", ..." if len(runs) > 5 else "")
                    star = os.path.join(m, "*")
                    every = f"give '{star}' for all of them, or one: " if several else "give one: "
                    raise ChiptraceError(
                        f"{m} holds {len(runs)} run{'s' if len(runs) != 1 else ''} ({shown}), "
                        f"not a trace: {every}chiptrace {command} {os.path.join(m, runs[-1])}"
                        + ("" if several else f" (or --run {runs[-1]})")
                    )


def runs_of(paths: list[str]) -> list[Run]:
    """The runs the dirs (globs expanded) hold, in the order given."""
    groups: dict[str, list[str]] = {}
    for raw in paths:
        # A glob that matches nothing stays as given: the store's error names it.
        matches = (sorted(glob.glob(raw)) if glob.has_magic(raw) else []) or [raw]
        for m in matches:
            p = Path(m)
            ids = sorted({str(x["run_id"]) for x in read_manifests([p]) if x.get("run_id")})
            key = "+".join(ids) if ids else p.name
            groups.setdefault(key, []).append(m)
    return [Run(k, tuple(v)) for k, v in groups.items()]


def pick(paths: list[str], run: str | None, command: str) -> list[Run]:
    """The runs to use: every run given, or the one `--run` names.

    Raises:
        ChiptraceError: not a trace dir (see check_given), or no run matches `--run`.
    """
    check_given(paths, command)
    runs = runs_of(paths)
    if run is None:
        return runs
    chosen = [
        r
        for r in runs
        if r.id == run or r.id.startswith(run) or any(Path(d).name == run for d in r.dirs)
    ]
    if len(chosen) != 1:
        listed = "; ".join(r.describe() for r in runs)
        what = "no run" if not chosen else "more than one run"
        raise ChiptraceError(f"--run {run}: {what} matches; the runs given are: {listed}")
    return chosen
