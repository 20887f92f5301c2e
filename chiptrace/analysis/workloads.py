"""Which spans are steps, and how many workloads a run holds.

A step is one unit of repeated work: a training step, a request, a batch. `--step GLOB`
names them (`'ProfilerStep#*'`, `'GET /*'`): any span whose name matches, root or not
(a match nested in another match is part of that step). Without it, the guess reads only
the spans that have children (one aggregate query; they are few) and prefers, in order:

0. spans with a step attribute (`train.step`, `step`, `iteration`: a number) that repeat
   (the program says what a step is: under `chiptrace.torch` its `step` spans hold the ops);
1. the PyTorch profiler's own step markers, `ProfilerStep#N` (an imported Kineto trace),
   however many and whether or not they have children;
2. the outermost spans that repeat: roots when roots repeat (one trace per step, per
   request), else the first level down that does (a loop inside one `train` span);
3. the most common root with children (a run of one step).

Names that differ only by a trailing number (`ProfilerStep#3`, `GET /users/42`) are one
name, written as a glob (`ProfilerStep#*`). Several names at the chosen level are several
workloads (mixed: `train_step` and `request`), each analysed on its own, so steps of
different names never mix. A name whose spans are mostly what another workload's steps
link to (the emulator's inference `batch`, which each `request` links to) is that
workload's back end, not a workload of its own. Device work (a span with a `launch` link:
a kernel, or a stream sync that encloses a copy) and a profiler's operator and runtime calls
(Kineto's `cpu_op`, `cuda_runtime`: `aten::to` repeats, but inside the steps) are never
steps.
"""

from __future__ import annotations

import re
import secrets
from collections import Counter, defaultdict
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, NoReturn

import pyarrow as pa

from chiptrace.analysis.errors import StepError

MAX_WORKLOADS = 4  # the busiest step names analysed; more are listed in the reason
PROFILER_STEPS = "ProfilerStep#*"  # torch.profiler's step annotation, one per schedule step
_PROFILER_STEP = re.compile(r"^ProfilerStep#\d+$")
_PROFILER_REASON = "the PyTorch profiler's step markers ({n} spans named ProfilerStep#N)"
_NUMBERED = re.compile(r"^(.*\D)(\d+)$", re.S)
_STEP_ATTR = r'"(?:[^"]*[._])?(?:step|iteration)"\s*:\s*-?[0-9]'
_STEP_NUMBER = r'"(?:[^"]*[._])?(?:step|iteration)"\s*:\s*(-?[0-9]+)'
# A step's number: its step attribute, else the trailing number of its name (ProfilerStep#3).
NUMBER_SQL = (
    f"coalesce(TRY_CAST(nullif(regexp_extract({{r}}attributes, '{_STEP_NUMBER}', 1), '') "
    "AS BIGINT), TRY_CAST(nullif(regexp_extract(CAST({r}name AS VARCHAR), '([0-9]+)$', 1), '') "
    "AS BIGINT))"
)
# A profiler's operator or runtime call (Kineto's `cpu_op`, `cuda_runtime`...): library work
# inside a step, never the step itself, however often it repeats.
_OP_CALL = r'"kineto[.]cat"\s*:\s*"(?:cpu_op|cuda_driver|[a-z0-9_]*_runtime)"'
# The process (rank) a span ran in: its resource's `distributed.rank`, else the resource
# itself (one per process). A step is a rank's: the same `ProfilerStep#10` of eight ranks
# shares a trace id, and its work must never land in another rank's step.
PROC_SQL = (
    "coalesce('rank' || json_extract_string({r}resource, '$.\"distributed.rank\"'), "
    "'p' || CAST(hash({r}resource) AS VARCHAR))"
)


def proc_sql(alias: str = "") -> str:
    """SQL for a span's process key (`PROC_SQL`), its columns read from `alias`."""
    return PROC_SQL.format(r=f"{alias}." if alias else "")


@dataclass(frozen=True, slots=True)
class StepChoice:
    """One workload's step: its display name, the span names it covers, and why."""

    name: str
    names: tuple[str, ...]
    spans: int
    reason: str
    glob: str | None = None  # the pattern that named it; its steps are then read from the store
    # What says these are training steps: "profiler" (ProfilerStep#N), "attribute" (a step
    # number on the span), "glob" (--step named them); "repeat": only that the name repeats
    # (a browser's task, a service's handler), which is training only with device work.
    evidence: str = "repeat"


def family(name: str) -> str:
    """`ProfilerStep#12` -> `ProfilerStep#*`: the name without its trailing number."""
    m = _NUMBERED.match(name)
    return m.group(1) + "*" if m else name


def arrow(con: Any, sql: str, params: list[Any] | None = None) -> pa.Table:
    """The result of `sql` as an Arrow table (DuckDB's method name differs by version)."""
    rel = con.execute(sql, params) if params else con.sql(sql)
    return rel.to_arrow_table() if hasattr(rel, "to_arrow_table") else rel.arrow()


@contextmanager
def _registered(con: Any, names: tuple[str, ...]) -> Any:
    view = f"_ct_names_{secrets.token_hex(4)}"
    con.register(view, pa.table({"name": pa.array(list(names), pa.string())}))
    try:
        yield view
    finally:
        con.unregister(view)


@contextmanager
def candidates(con: Any, orphans: list[bytes] | None = None) -> Any:
    """A temporary table of the spans that have children, over the whole store (the only
    possible guessed steps; a few percent of spans), with whether a child is on a chip or
    a link (`tables` asks that of chip and link spans). One pass over the store's parent
    ids and one over its span ids: about 1 CPU-s on 10M spans. `orphans` gets the parent
    ids no span behind `con` has (a share of a store: parents it leaves to another)."""
    tmp = f"_ct_cand_{secrets.token_hex(4)}"
    par = f"_ct_par_{secrets.token_hex(4)}"
    con.execute(f"""
        CREATE TEMP TABLE {par} AS
        SELECT parent_span_id AS id, bool_or(chip_id IS NOT NULL) AS chip_child,
               bool_or(link_id IS NOT NULL) AS link_child
        FROM spans_raw WHERE parent_span_id IS NOT NULL GROUP BY 1""")
    cols = f"""s.trace_id, s.span_id, s.parent_span_id, CAST(s.name AS VARCHAR) AS name,
               s.start_ns, greatest(s.end_ns, s.start_ns) AS end_ns, s.links,
               coalesce(regexp_matches(s.attributes, '{_STEP_ATTR}'), false) AS attr,
               coalesce(regexp_matches(s.attributes, '{_OP_CALL}'), false) AS op_call,
               s.chip_id IS NOT NULL AS on_chip, s.link_id IS NOT NULL AS on_link,
               p.chip_child, p.link_child, {proc_sql("s")} AS proc,
               {NUMBER_SQL.format(r="s.")} AS number"""
    # Parents off the links first: finding a span by id reads every span id (the largest
    # column), and an nvl72 run is 99.9% link transfers, none of them a parent. Those
    # only are probed for the ids still missing, which are usually none.
    con.execute(f"""
        CREATE TEMP TABLE {tmp} AS
        SELECT {cols} FROM spans_raw s JOIN {par} p ON p.id = s.span_id
        WHERE s.link_id IS NULL""")
    con.execute(f"DELETE FROM {par} WHERE id IN (SELECT span_id FROM {tmp})")
    if con.sql(f"SELECT count(*) FROM {par}").fetchall()[0][0]:
        con.execute(f"""
            INSERT INTO {tmp} SELECT {cols} FROM spans_raw s JOIN {par} p ON p.id = s.span_id
            WHERE s.link_id IS NOT NULL""")
        if orphans is not None:
            orphans += [
                i
                for (i,) in con.sql(
                    f"SELECT id FROM {par} ANTI JOIN {tmp} ON span_id = id"
                ).fetchall()
            ]
    con.execute(f"DROP TABLE IF EXISTS {par}")
    try:
        yield tmp
    finally:
        con.execute(f"DROP TABLE IF EXISTS {tmp}")


def in_window(tmp: str, where: str) -> str:
    """FROM-clause SQL for the candidates that overlap the analysed range."""
    return f"(SELECT * FROM {tmp} WHERE {where})"


@dataclass
class _Family:
    name: str
    names: Counter[str]
    spans: int = 0
    roots: int = 0
    attr: bool = False
    total_ns: float = 0.0
    parents: Counter[str] = field(default_factory=Counter)


def family_rows(con: Any, tmp: str) -> list[tuple[Any, ...]]:
    """Per (name, parent's name, root): spans, step attribute, summed duration, of the
    candidates `tmp`; the rows of a store's shares (stages on a cluster) add up."""
    rows: list[tuple[Any, ...]] = con.sql(f"""
        SELECT c.name, pc.name AS parent, c.parent_span_id IS NULL AS root, count(*) AS n,
               bool_or(c.attr) AS attr, sum(CAST(c.end_ns AS DOUBLE) - c.start_ns) AS ns
        FROM {tmp} c LEFT JOIN {tmp} pc
             ON pc.span_id = c.parent_span_id AND pc.trace_id = c.trace_id
        WHERE NOT c.op_call AND NOT coalesce(c.links LIKE '%"kind":"launch"%', false)
        GROUP BY ALL""").fetchall()
    return rows


def _families(rows: list[tuple[Any, ...]]) -> dict[str, _Family]:
    fams: dict[str, _Family] = {}
    for name, parent, root, n, attr, ns in rows:
        f = fams.setdefault(family(name), _Family(family(name), Counter()))
        f.names[name] += n
        f.spans += n
        f.roots += n if root else 0
        f.attr |= bool(attr)
        f.total_ns += float(ns or 0)
        if parent is not None and family(parent) != f.name:
            f.parents[family(parent)] += n
    for f in fams.values():  # a lone `conv2d` keeps its name: only numbers that vary merge
        if len(f.names) == 1:
            f.name = next(iter(f.names))
    return {f.name: f for f in fams.values()}


def _up(fams: dict[str, _Family]) -> dict[str, str | None]:
    """Each family's parent family (its spans' most common parent), None at the top."""
    by_key = {family(n): f for f in fams.values() for n in f.names}
    out: dict[str, str | None] = {}
    for f in fams.values():
        up = by_key.get(f.parents.most_common(1)[0][0]) if f.parents else None
        out[f.name] = up.name if up is not None and up is not f else None
    return out


def _depths(fams: dict[str, _Family]) -> dict[str, int]:
    """Levels below the top, memoized (a 10,000-deep chain of distinct names is linear)."""
    up = _up(fams)
    depth: dict[str, int] = {}
    for start in fams:
        chain: list[str] = []
        cur: str | None = start
        while cur is not None and cur not in depth and cur not in chain:
            chain.append(cur)
            cur = up[cur]
        d = depth.get(cur, -1) if cur is not None and cur not in chain else -1
        for name in reversed(chain):
            d += 1
            depth[name] = d
    return depth


def _ancestors(fams: dict[str, _Family], picked: list[_Family]) -> set[str]:
    up = _up(fams)
    out: set[str] = set()
    for f in picked:
        cur = up[f.name]
        while cur is not None and cur not in out and cur != f.name:
            out.add(cur)
            cur = up[cur]
    return out


def link_rows(con: Any, tmp: str) -> list[tuple[Any, ...]]:
    """Per (root's name, linked span's name): the linked spans, among the candidates."""
    rows: list[tuple[Any, ...]] = con.sql(f"""
        WITH l AS (SELECT c.name, unnest(json_extract_string(c.links, '$[*].span_id')) AS sid
                   FROM {tmp} c
                   WHERE c.parent_span_id IS NULL AND c.links IS NOT NULL AND json_valid(c.links)
                     AND json_type(c.links) = 'ARRAY')
        SELECT l.name, t.name, count(DISTINCT t.span_id)
        FROM l JOIN {tmp} t ON lower(hex(t.span_id)) = lower(l.sid) GROUP BY ALL""").fetchall()
    return rows


def _back_ends(rows: list[tuple[Any, ...]], fams: dict[str, _Family]) -> dict[str, str]:
    """Families whose spans are mostly link targets of another family's root spans."""
    by_name = {n: f.name for f in fams.values() for n in f.names}
    targets: dict[tuple[str, str], int] = defaultdict(int)
    for src, dst, n in rows:
        a, b = by_name.get(src), by_name.get(dst)
        if a and b and a != b:
            targets[(a, b)] += n
    return {b: a for (a, b), n in targets.items() if n * 2 >= fams[b].spans}


def guess(
    con: Any, tmp: str, max_workloads: int = MAX_WORKLOADS, where: str | None = None
) -> list[StepChoice]:
    """The workloads' steps as the module docstring describes, busiest first (`where`, the
    analysed range's SQL condition, lets profiler steps without children be found too)."""
    return guess_from(
        family_rows(con, tmp),
        lambda: link_rows(con, tmp),
        None if where is None else lambda: glob_rows(con, where, PROFILER_STEPS),
        max_workloads,
    )


def guess_from(
    families: list[tuple[Any, ...]],
    links: Callable[[], list[tuple[Any, ...]]],
    profiler_steps: Callable[[], list[tuple[Any, ...]]] | None,
    max_workloads: int = MAX_WORKLOADS,
) -> list[StepChoice]:
    """`guess` from the rows of `family_rows`, `link_rows` and, where profiler steps may
    be found without children, `glob_rows` of PROFILER_STEPS (each asked for only if
    needed): one store's, or its shares' together."""
    fams = _families(families)
    if not fams:
        return []
    # The program's own step spans (a step number on a span that repeats) win over the
    # profiler's markers: under chiptrace.torch the ops sit under the program's `step`.
    own = any(f.attr and f.spans >= 2 for f in fams.values())
    profiler = any(_PROFILER_STEP.match(n) for f in fams.values() for n in f.names)
    if profiler_steps is not None and profiler and not own:
        return [
            StepChoice(
                c.name, c.names, c.spans, _PROFILER_REASON.format(n=c.spans), c.glob, "profiler"
            )
            for c in choose_from(profiler_steps(), PROFILER_STEPS, max_workloads)
        ]
    depth = _depths(fams)
    back = _back_ends(links(), fams)
    repeating = [f for f in fams.values() if f.spans >= 2 and f.name not in back]
    tagged = [f for f in repeating if f.attr]
    if tagged:
        top = min(depth[f.name] for f in tagged)
        picked = [f for f in tagged if depth[f.name] == top]
        # Other repeating roots are workloads of their own (mixed: `request` beside a
        # tagged `train_step`), unless they only contain the tagged steps (an `epoch`).
        above = _ancestors(fams, picked)
        picked += [
            f
            for f in repeating
            if depth[f.name] == 0
            and f not in picked
            and f.name not in above
            and not any(_PROFILER_STEP.match(n) for n in f.names)  # the profiler's markers
        ]
        why = "repeats with a step attribute, or is a root that repeats"
    elif repeating:
        top = min(depth[f.name] for f in repeating)
        picked = [f for f in repeating if depth[f.name] == top]
        why = "the outermost span that repeats" + (" (a root)" if top == 0 else "")
    else:
        roots = [f for f in fams.values() if f.roots] or list(fams.values())
        picked = [max(roots, key=lambda f: (f.spans, f.name))]
        why = "the only span with children that is a root" if len(roots) == 1 else "no span repeats"
    picked.sort(key=lambda f: (-f.total_ns, f.name))
    left = picked[max_workloads:]
    out = []
    for f in picked[:max_workloads]:
        reason = f"{f.spans} span{'s' if f.spans != 1 else ''} with children; {why}"
        if len(f.names) > 1:
            reason += f"; {len(f.names)} names that differ by a number"
        ends = sorted(b for b, a in back.items() if a == f.name)
        if ends:
            reason += f"; its steps link to {', '.join(repr(b) for b in ends)} (their back end)"
        if left:
            reason += f"; not analysed: {', '.join(repr(x.name) for x in left)}"
        evidence = "attribute" if f.attr else "repeat"
        out.append(StepChoice(f.name, tuple(sorted(f.names)), f.spans, reason, None, evidence))
    return out


def choose_glob(con: Any, where: str, pattern: str, max_workloads: int = MAX_WORKLOADS) -> list:
    """The workloads a `--step` glob names: matching span names grouped by `family`.

    Raises:
        StepError: the pattern matches no span (the message lists the commonest names).
    """
    out = choose_from(glob_rows(con, where, pattern), pattern, max_workloads)
    if not out:
        no_match(con, where, pattern)
    return out


def glob_rows(con: Any, where: str, pattern: str) -> list[tuple[str, int]]:
    """(name, spans) of the span names `pattern` matches; a store's shares' rows add up."""
    rows: list[tuple[str, int]] = con.execute(
        f"SELECT CAST(name AS VARCHAR) AS n, count(*) FROM spans_raw "
        f"WHERE CAST(name AS VARCHAR) GLOB $1 AND {where} GROUP BY 1",
        [pattern],
    ).fetchall()
    return rows


def no_match(con: Any, where: str, pattern: str) -> NoReturn:
    """Raise StepError: `pattern` matches no span name (naming the commonest ones)."""
    common = con.sql(
        f"SELECT CAST(name AS VARCHAR), count(*) AS c FROM spans_raw WHERE {where} "
        "GROUP BY 1 ORDER BY c DESC, 1 LIMIT 5"
    ).fetchall()
    names = ", ".join(f"{n!r} ({c})" for n, c in common) or "none: the trace has no spans"
    raise StepError(f"--step {pattern!r} matches no span name; the most common: {names}")


def choose_from(
    rows: list[tuple[str, int]], pattern: str, max_workloads: int = MAX_WORKLOADS
) -> list[StepChoice]:
    """`choose_glob`'s workloads from `glob_rows` (a store's, or its shares' together)."""
    fams: dict[str, Counter] = defaultdict(Counter)
    for n, c in rows:
        fams[family(n)][n] += c
    ranked = sorted(fams.items(), key=lambda kv: (-sum(kv[1].values()), kv[0]))
    out = []
    for key, members in ranked[:max_workloads]:
        name = key if len(members) > 1 else next(iter(members))
        spans = sum(members.values())
        reason = f"--step {pattern!r}: {spans} spans"
        out.append(StepChoice(name, tuple(sorted(members)), spans, reason, pattern, "glob"))
    return out


def step_rows(con: Any, choice: StepChoice, where: str, tmp: str | None) -> pa.Table:
    """The steps of one workload: trace_id, span_id (hex), name, start_ns, end_ns, links,
    proc (the process or rank that ran it, `proc_sql`), number (its step attribute, else
    its name's trailing number); a span nested in another step of the same workload
    belongs to that one."""
    src = (
        tmp
        or f"""(SELECT trace_id, span_id, parent_span_id, CAST(name AS VARCHAR) AS name,
                             start_ns, greatest(end_ns, start_ns) AS end_ns, links,
                             {proc_sql()} AS proc, {NUMBER_SQL.format(r="")} AS number
                      FROM spans_raw WHERE {where})"""
    )
    with _registered(con, choice.names) as names:
        return arrow(
            con,
            f"""
            WITH m AS MATERIALIZED (SELECT c.* FROM {src} c SEMI JOIN {names} n ON c.name = n.name)
            SELECT lower(hex(m.trace_id)) AS trace_id, lower(hex(m.span_id)) AS span_id,
                   m.name, m.start_ns, m.end_ns, m.links, m.proc, m.number
            FROM m ANTI JOIN m AS pm ON pm.span_id = m.parent_span_id AND pm.trace_id = m.trace_id
            ORDER BY m.start_ns, m.span_id""",
        )


def merge_step_rows(parts: list[pa.Table]) -> pa.Table:
    """`step_rows` of a store's shares (each step nested only in its own share's steps)
    as one: in `step_rows`' order, start then span id."""
    table = pa.concat_tables(parts, promote_options="permissive")
    return table.sort_by([("start_ns", "ascending"), ("span_id", "ascending")])
