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

_APPENDED = ("import", "emulator")  # the writers that add a run to a dir only with --append
# What a trace file made elsewhere looks like (what `chiptrace import` reads).
_TRACE_FILE_SUFFIXES = (".json", ".json.gz", ".jsonl", ".jsonl.gz", ".gz", ".pb", ".otlp")


@dataclass(frozen=True)
class Run:
    """One run among the dirs given: its id (or its dir's name), its dirs, and the paths to
    read it from (its dirs, or its own parts where a dir holds several runs)."""

    id: str
    dirs: tuple[str, ...]
    paths: tuple[str, ...]

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


def check_given(
    paths: list[str], command: str, several: bool = True, run_flag: bool = True
) -> None:
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
                raise ChiptraceError(
                    f"{m}: expected a trace dir (a folder of Parquet parts), not a file"
                )
            if p.is_dir() and not _is_store(p):
                runs = sorted(c.name for c in p.iterdir() if c.is_dir() and _is_store(c))
                if runs:
                    shown = ", ".join(runs[:5]) + (", ..." if len(runs) > 5 else "")
                    star = os.path.join(m, "*")
                    every = f"give '{star}' for all of them, or one: " if several else "give one: "
                    raise ChiptraceError(
                        f"{m} holds {len(runs)} run{'s' if len(runs) != 1 else ''} ({shown}), "
                        f"not a trace: {every}chiptrace {command} {os.path.join(m, runs[-1])}"
                        + ("" if several or not run_flag else f" (or --run {runs[-1]})")
                    )


def runs_of(paths: list[str]) -> list[Run]:
    """The runs the dirs (globs expanded) hold, in the order given. A dir that holds several
    runs (`import --append`) gives each its own parts."""
    groups: dict[str, tuple[list[str], list[str]]] = {}
    for raw in paths:
        # A glob that matches nothing stays as given: the store's error names it.
        matches = (sorted(glob.glob(raw)) if glob.has_magic(raw) else []) or [raw]
        for m in matches:
            by_run: dict[str, list[str]] = {}
            manifests = read_manifests([Path(m)])
            for x in manifests:
                by_run.setdefault(str(x.get("run_id") or ""), []).append(str(x.get("writer_id")))
            # Runs added with --append (import, emulate) are apart; the processes of a
            # recorded run may carry run ids of their own and stay one run.
            appended = all(x.get("source") in _APPENDED and x.get("writer_id") for x in manifests)
            if len(by_run) > 1 and Path(m).is_dir() and appended:
                for run_id, writers in by_run.items():
                    dirs, parts = groups.setdefault(run_id, ([], []))
                    dirs.append(m)
                    parts += [
                        str(Path(m) / SPANS_DIR / f"part-{w}-*{PART_SUFFIX}") for w in writers
                    ]
                continue
            key = "+".join(sorted(by_run)) if any(by_run) else Path(m).name
            dirs, parts = groups.setdefault(key, ([], []))
            dirs.append(m)
            parts.append(m)
    return [Run(k, tuple(d), tuple(p)) for k, (d, p) in groups.items()]


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
