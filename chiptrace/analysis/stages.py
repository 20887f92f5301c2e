"""The report's per-rank and per-step stages, as functions a cluster can run.

Each stage is a plain function of (a source, a selection) that returns a small result: a
source is an open connection (in process) or a tuple of store paths, trace dirs or part
files (on a Dask worker, which opens its own DuckDB over them for the task). `TraceAnalysis` hands every call to a `Runner`: `InProcess` calls them here, in
order; chiptrace.cluster's runs them as Dask tasks. The client merges the results the same
way either runner returns them, so a report on a cluster is the single-process report.

- replays (`replay_stage`): the workload's replayed steps' dependency graphs, replayed
  under some of the findings' fixes (analysis/whatif.py); the fixes are split over the
  workers (each carries its own state from step to step, so its steps stay together);
- per step (`step_stage`): one sampled step's span-level analysis (its critical path),
  given its spans: the client loads the sampled steps with one query, as the rules need
  them there anyway (one query, not one a step: a span that starts before its own step
  is still read where another sampled step's bounds hold it);
- per rank (`rank_stage`): HTA's GPU time breakdown and launch queue (analysis/ranks.py,
  analysis/launch.py) of the ranks in the source. Their SQL works rank by rank (every
  window and group is per rank), with one exception made explicit: whether HTA's last-step
  filter is on depends on the step names of the whole run, so the client decides it from
  every task's names and runs again, with the run's answer, any rank that decided alone
  otherwise. With `import --partition-by rank` a task reads `spans/rank=R/` only.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import pyarrow as pa

from chiptrace.analysis.critical_path import critical_path
from chiptrace.analysis.findings import CriticalPath
from chiptrace.analysis.launch import launch_queue
from chiptrace.analysis.ranks import STEP_NAMES_SQL, rank_breakdown
from chiptrace.analysis.steps import Step, load_steps

Source = Any  # a DuckDB connection, or a tuple of paths (trace dirs or part files)

# The report's DuckDB memory share (trace_analysis.MEMORY_LIMIT), per task on a worker.
TASK_MEMORY_LIMIT = "2GB"


class Runner(Protocol):
    """Where stages run. `remote`: the calls get store paths, not this connection;
    `parallelism`: stages worth running at once (a replay's changes are split that many
    ways, each part building the steps' graphs again)."""

    remote: bool
    parallelism: int

    def map(self, name: str, fn: Callable[..., Any], calls: Sequence[tuple[Any, ...]]) -> list[Any]:
        """`[fn(*args) for args in calls]`, in that order."""
        ...


class InProcess:
    """Runs every stage here, one after another, on the analysis's own connection;
    `progress(done, total)` after each (a terminal's progress bar)."""

    remote = False
    parallelism = 1  # one replay stage for all the changes: each step's graph built once

    def __init__(self, progress: Callable[[int, int], None] | None = None) -> None:
        self.progress = progress
        self.done = self.total = 0

    def map(self, name: str, fn: Callable[..., Any], calls: Sequence[tuple[Any, ...]]) -> list[Any]:
        self.total += len(calls)
        out = []
        for args in calls:
            out.append(fn(*args))
            self.done += 1
            if self.progress:
                self.progress(self.done, self.total)
        return out


@contextmanager
def connection(src: Source) -> Iterator[Any]:
    """The connection a stage works on: `src` itself, or one opened over its paths for
    this task (not kept: the next task may find a store that has grown since)."""
    if not isinstance(src, tuple):
        yield src
        return
    from chiptrace.query import connect

    con = connect(list(src), memory_limit=TASK_MEMORY_LIMIT, macros=False)
    try:
        yield con
    finally:
        con.close()


# ---------------------------------------------------------------- per step


def step_stage(step: Step) -> CriticalPath:
    """One sampled step's span-level analysis: its critical path."""
    return critical_path(step.spans, step.root_id)


def sampled_steps(
    runner: Runner, con: Any, steps: pa.Table, rows: Sequence[int]
) -> tuple[list[Step], list[CriticalPath]]:
    """The sampled steps (in `rows` order), loaded here with one query (the spans of all of
    them, as the rules read them), and their critical paths, a stage each."""
    loaded = load_steps(con, steps, rows)
    return loaded, runner.map("step", step_stage, [(s,) for s in loaded])


def replay_stage(
    src: Source, steps: pa.Table, rows: Sequence[int], changes: Mapping[str, Any], topo: Any
) -> dict[str, list[float]]:
    """The steps `rows`' graphs (built as in process: graphs.iter_graphs), replayed
    under some of the changes (whatif.replay_all): measured and replayed step times."""
    from chiptrace.analysis.graphs import iter_graphs
    from chiptrace.analysis.whatif import replay_all

    with connection(src) as con:
        out: dict[str, list[float]] = replay_all(iter_graphs(con, steps, rows), changes, topo)
        return out


class Stages:
    """A runner and what its stages read: `con` in process, the store's paths remote."""

    def __init__(self, runner: Runner, con: Any, sources: Sequence[str]) -> None:
        self.runner = runner
        self.src: Source = (
            tuple(os.fspath(Path(p).resolve()) for p in sources) if runner.remote else con
        )

    def replays(
        self, steps: pa.Table, rows: Sequence[int], changes: Mapping[str, Any], topo: Any
    ) -> dict[str, list[float]]:
        """whatif.replay_all over the steps `rows`, the changes split over the runner's
        workers. Not the steps: a replay carries each change's state from one step to the
        next (work that waited for the step before), so a change's steps stay together in
        one stage, as in process; the changes are independent of one another."""
        keys = list(changes)
        if not keys:  # nothing to price: evaluate reads no measured time alone
            return {"measured": []}
        n = max(1, min(len(keys), getattr(self.runner, "parallelism", 1)))
        groups = [keys[i::n] for i in range(n)]
        calls = [(self.src, steps, list(rows), {k: changes[k] for k in g}, topo) for g in groups]
        parts = self.runner.map("replay", replay_stage, calls)
        out: dict[str, list[float]] = {"measured": parts[0]["measured"] if parts else []}
        merged = {k: v for part in parts for k, v in part.items() if k != "measured"}
        out.update((k, merged[k]) for k in keys)  # in the changes' order, as in process
        return out


# ---------------------------------------------------------------- per rank


@dataclass(frozen=True)
class RankPart:
    """One source's share of the per-rank figures."""

    step_names: frozenset[str]
    filtering: bool  # whether HTA's last-step filter was on for these figures
    ranks: list[dict[str, Any]]
    launch: list[dict[str, Any]]


def rank_stage(
    src: Source, since_ns: int | None, until_ns: int | None, filtering: bool | None
) -> RankPart:
    """The GPU time breakdown and launch queue of the ranks in `src`; `filtering` None:
    decided from the step names `src` holds."""
    with connection(src) as con:
        names = frozenset(n for (n,) in con.execute(STEP_NAMES_SQL).fetchall())
        on = len(names) >= 2 if filtering is None else filtering
        ranks = rank_breakdown(con, since_ns, until_ns, on)
        # HTA's launch queue needs its device events: none where there is no rank breakdown.
        launch = launch_queue(con, since_ns, until_ns, on) if ranks else []
    return RankPart(names, on, ranks, launch)


def rank_shares(sources: Sequence[str]) -> list[tuple[str, ...]] | None:
    """The part files of each rank, where every part of the store sits under
    `spans/rank=R/` (`import --partition-by rank`); else None."""
    from chiptrace.store import expand_dirs, part_files

    by_rank: dict[str, list[str]] = {}
    for d in expand_dirs(sources):
        for p in part_files(d):
            folder = p.parent.name
            if d.is_file() or not folder.startswith("rank=") or p.parent.parent.name != "spans":
                return None
            by_rank.setdefault(folder, []).append(str(p.resolve()))
    if len(by_rank) < 2:
        return None
    return [tuple(by_rank[k]) for k in sorted(by_rank, key=lambda k: int(k[5:]))]


def rank_figures(
    runner: Runner,
    con: Any,
    sources: Sequence[str],
    since_ns: int | None,
    until_ns: int | None,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """`metrics.ranks` and `launch` of the report: one stage over the whole run, or on a
    cluster over a hive-partitioned store one per rank, merged in rank order."""
    shares = rank_shares(sources) if runner.remote and sources else None
    if shares is None:
        src = tuple(os.fspath(Path(s).resolve()) for s in sources) if runner.remote else con
        (whole,) = runner.map("ranks", rank_stage, [(src, since_ns, until_ns, None)])
        return whole.ranks, whole.launch
    parts: list[RankPart] = runner.map(
        "rank", rank_stage, [(s, since_ns, until_ns, None) for s in shares]
    )
    on = len(frozenset().union(*(p.step_names for p in parts))) >= 2
    again = [i for i, p in enumerate(parts) if p.filtering != on]
    redone = runner.map("rank", rank_stage, [(shares[i], since_ns, until_ns, on) for i in again])
    for i, p in zip(again, redone, strict=True):
        parts[i] = p
    ranks = [r for p in parts for r in p.ranks]
    if len({r["rank"] for r in ranks}) != len(ranks):  # files without a rank: not separable
        src = tuple(f for s in shares for f in s)
        (whole,) = runner.map("ranks", rank_stage, [(src, since_ns, until_ns, None)])
        return whole.ranks, whole.launch
    launch = sorted((r for p in parts for r in p.launch), key=lambda r: (r["rank"], r["stream"]))
    return sorted(ranks, key=lambda r: r["rank"]), launch
