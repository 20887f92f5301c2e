"""Each workload's steps, and the per-step figures of the chips and links that serve them.

A step's chips are those with work in its trace, or, for a step that shares its trace with
other steps (a loop inside one `train` span), with work that starts in its time window.
A step whose root links to other traces (a request linking to the inference batch that
served it) also gets the chips of those traces: that is where its work ran.
"""

from __future__ import annotations

import json
import re
import secrets
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from chiptrace.analysis import workloads as wl
from chiptrace.analysis.workloads import StepChoice

_STEP_NAME = re.compile(r"(?i)step|iteration|batch")
STRAGGLER_STEPS = 128  # steps the per-step, per-chip figures are taken from ...
SMALL_STEP_SPANS = 100  # ... and from 4x as many when steps are this small (requests: one
# chip each, so a chip's share of 128 is too few to test; small steps are cheap to read)
_STEP_CHIP_COLUMNS = {
    "step_id": pa.string(),
    "chip_id": pa.string(),
    "chip_type": pa.string(),
    "first_ns": pa.int64(),
    "last_ns": pa.int64(),
    "op_ns": pa.int64(),
    "comm_ns": pa.int64(),  # of op_ns, in comm ops on the chip (collective kernels: waiting)
}


@dataclass
class WorkloadTables:
    """One workload: its steps, and per (sampled step, chip) its first/last op and op time.

    Attributes:
        choice: the step name, the span names it covers, and why it was chosen.
        steps: trace_id, span_id (hex), name, start_ns, end_ns, links (OTel links JSON).
        step_chips: step_id (the step's span id), chip_id, chip_type, first_ns, last_ns,
            op_ns, comm_ns, over up to STRAGGLER_STEPS steps spread over the run.
        chips, links: the chip and link ids with work in those steps.
    """

    choice: StepChoice
    steps: pa.Table
    step_chips: pa.Table
    chips: frozenset[str]
    links: frozenset[str]

    @property
    def name(self) -> str:
        return self.choice.name

    @property
    def training(self) -> bool:
        """Whether the trace shows these are training (or inference) steps: the profiler's
        step markers, a step attribute, a name given with --step, or device work (GPU/NPU)
        under the repeating span. Otherwise they are tasks (a browser's, a service's), and
        step and training advice does not apply to them. (A span that occurs once, a
        benchmark's one timed call, is no loop, unless its name says it is a step.)"""
        if self.choice.evidence != "repeat":
            return True
        if self.steps.num_rows < 2 and not _STEP_NAME.search(self.choice.name):
            return False
        return any(t in ("gpu", "npu") for t in self.step_chips.column("chip_type").to_pylist())


def empty_step_chips() -> pa.Table:
    return pa.table({k: pa.array([], t) for k, t in _STEP_CHIP_COLUMNS.items()})


def linked_traces(raw: Any) -> list[str]:
    """Hex trace ids an OTel links JSON value points to (bad JSON: none)."""
    try:
        items = json.loads(raw) if isinstance(raw, str) and raw else []
    except ValueError:
        return []
    out = []
    for it in items if isinstance(items, list) else []:
        t = it.get("trace_id") if isinstance(it, dict) else None
        if isinstance(t, str) and len(t) == 32 and all(c in "0123456789abcdefABCDEF" for c in t):
            out.append(t.lower())
    return out


@contextmanager
def _register(con: Any, table: pa.Table) -> Iterator[str]:
    name = f"_ct_steps_{secrets.token_hex(4)}"
    con.register(name, table)
    try:
        yield name
    finally:
        con.unregister(name)


def _blob(hexes: list[str]) -> pa.Array:
    return pa.array([bytes.fromhex(h) for h in hexes], pa.binary(16))


def _sample(steps: pa.Table, max_steps: int) -> list[dict[str, Any]]:
    n = steps.num_rows
    stride = max(n // max_steps, 1)
    return steps.take(pa.array(list(range(0, n, stride))[:max_steps])).to_pylist() if n else []


def _step_traces(steps: pa.Table, sel: list[dict[str, Any]]) -> tuple[pa.Table, pa.Table]:
    """The traces whose chip work belongs to the sampled steps: (trace_id, step_id) for a
    step alone in its trace and for the traces its root links to; (trace_id, proc, sid,
    step_id, s, e) for steps that share a trace (a loop inside one span; the same
    `ProfilerStep#N` of every rank), whose work is theirs by parent, process and time."""
    per_trace = Counter(steps.column("trace_id").to_pylist())
    eq: list[tuple[str, str]] = []
    win: list[dict[str, Any]] = []
    for r in sel:
        if per_trace[r["trace_id"]] == 1:
            eq.append((r["trace_id"], r["span_id"]))
        else:
            win.append(r)
        eq += [(t, r["span_id"]) for t in linked_traces(r.get("links")) if t != r["trace_id"]]
    eq = list(dict.fromkeys(eq))
    eq_t = pa.table(
        {
            "trace_id": _blob([t for t, _ in eq]),
            "step_id": pa.array([s for _, s in eq], pa.string()),
        }
    )
    win_t = pa.table(
        {
            "trace_id": _blob([w["trace_id"] for w in win]),
            "proc": pa.array([w.get("proc") or "" for w in win], pa.string()),
            "sid": pa.array([bytes.fromhex(w["span_id"]) for w in win], pa.binary()),
            "step_id": pa.array([w["span_id"] for w in win], pa.string()),
            "s": pa.array([w["start_ns"] for w in win], pa.int64()),
            "e": pa.array([w["end_ns"] for w in win], pa.int64()),
        }
    )
    return eq_t, win_t


# Work of a step that shares its trace: a direct child of the step is its own (a kernel
# the step launched, however late the GPU ran it); other work is the step's of its own
# process (rank) that started last before it, and inside it; work of a process with no
# step in the trace (a worker the step called) goes by time alone.
_SHARED_SQL = """
    SELECT w.step_id, leaf.* FROM leaf JOIN {w} w
        ON w.sid = leaf.parent_span_id AND w.trace_id = leaf.trace_id
    UNION ALL
    SELECT w.step_id, o.* FROM (leaf ANTI JOIN {w} k
            ON k.sid = leaf.parent_span_id AND k.trace_id = leaf.trace_id) o
        ASOF JOIN {w} w ON o.trace_id = w.trace_id AND o.proc = w.proc AND o.start_ns >= w.s
    WHERE o.start_ns < w.e
    UNION ALL
    SELECT w.step_id, o.* FROM (leaf ANTI JOIN (SELECT DISTINCT trace_id, proc FROM {w}) k
            ON k.trace_id = leaf.trace_id AND k.proc = leaf.proc) o
        ASOF JOIN {w} w ON o.trace_id = w.trace_id AND o.start_ns >= w.s
    WHERE o.start_ns < w.e"""


def step_chips(
    con: Any,
    steps: pa.Table,
    where: str,
    lo: int,
    hi: int,
    max_steps: int = STRAGGLER_STEPS,
    links: bool = True,
) -> tuple[pa.Table, frozenset[str]]:
    """Per (step, chip) figures over up to `max_steps` steps spread over the run, and (with
    `links`) the link ids those steps used. Filtering on trace ids is cheap in Parquet
    (about 0.1 CPU-s on 10M spans, where grouping every op by step costs 2). Only chip
    spans are held (a leaf is a chip span no chip span names as parent): on an nvl72 run
    nearly every span is a link transfer, and holding those took minutes and gigabytes."""
    sel = _sample(steps, max_steps)
    if not sel:
        return empty_step_chips(), frozenset()
    eq_t, win_t = _step_traces(steps, sel)
    traces = sorted({t.hex() for t in eq_t["trace_id"].to_pylist() + win_t["trace_id"].to_pylist()})
    in_list = ", ".join(f"unhex('{t}')" for t in traces)
    proc = wl.proc_sql() if win_t.num_rows else "''"
    base = f"""
        sp AS MATERIALIZED (
            SELECT trace_id, span_id, parent_span_id, CAST(chip_id AS VARCHAR) AS chip_id,
                   CAST(chip_type AS VARCHAR) AS chip_type, op_kind, {proc} AS proc,
                   greatest(start_ns, {lo}) AS start_ns, least(end_ns, {hi}) AS end_ns
            FROM spans_raw WHERE trace_id IN ({in_list}) AND chip_id IS NOT NULL AND {where}),
        p AS (SELECT DISTINCT parent_span_id AS id FROM sp),
        leaf AS (SELECT sp.* FROM sp ANTI JOIN p ON p.id = sp.span_id
                 WHERE op_kind IS DISTINCT FROM 'idle' AND end_ns > start_ns)"""
    agg = """any_value(chip_type) AS chip_type, min(start_ns) AS first_ns,
             max(end_ns) AS last_ns, CAST(sum(end_ns - start_ns) AS BIGINT) AS op_ns,
             CAST(coalesce(sum(end_ns - start_ns) FILTER (WHERE op_kind = 'comm'), 0)
                  AS BIGINT) AS comm_ns"""
    with _register(con, eq_t) as e_name, _register(con, win_t) as w_name:
        table = wl.arrow(
            con,
            f"""
            WITH {base},
            per AS (SELECT trace_id, chip_id, {agg} FROM leaf GROUP BY trace_id, chip_id),
            shared AS ({_SHARED_SQL.format(w=w_name)})
            SELECT e.step_id, per.chip_id, per.chip_type, per.first_ns, per.last_ns, per.op_ns,
                   per.comm_ns
            FROM per JOIN {e_name} e ON e.trace_id = per.trace_id
            UNION ALL
            SELECT step_id, chip_id, {agg} FROM shared GROUP BY step_id, chip_id""",
        )
    used: frozenset[str] = frozenset()
    if links:  # a streamed DISTINCT: one pass over the steps' traces, a row per link
        rows = con.sql(
            f"SELECT DISTINCT CAST(link_id AS VARCHAR) FROM spans_raw "
            f"WHERE trace_id IN ({in_list}) AND link_id IS NOT NULL AND {where}"
        ).fetchall()
        used = frozenset(r[0] for r in rows)
    return table.cast(pa.schema(_STEP_CHIP_COLUMNS)), used


def load_workloads(
    con: Any, where: str, lo: int, hi: int, spans: int, cands: str, step_glob: str | None = None
) -> list[WorkloadTables]:
    """Every workload's steps and per-step chip figures (ordered as guessed or matched);
    `cands` is the table `workloads.candidates` made.

    Raises:
        StepError: `step_glob` matches no span.
    """
    if step_glob:
        choices = wl.choose_glob(con, where, step_glob)
        rows = [wl.step_rows(con, c, where, None) for c in choices]
    else:
        src = wl.in_window(cands, where)
        choices = wl.guess(con, src, where=where)
        rows = [wl.step_rows(con, c, where, None if c.glob else src) for c in choices]
    max_steps, links = chip_sample(spans, rows)
    out = []
    for choice, steps in zip(choices, rows, strict=True):
        sc, used = step_chips(con, steps, where, lo, hi, max_steps, links)
        out.append(workload(choice, steps, sc, used))
    return out


def chip_sample(spans: int, rows: list[pa.Table]) -> tuple[int, bool]:
    """`step_chips`' `max_steps` and `links` for workloads of these steps (`rows`)."""
    n_steps = sum(r.num_rows for r in rows)
    big = spans > SMALL_STEP_SPANS * max(n_steps, 1)
    # One workload owns every link anyway (TraceAnalysis.inputs): no pass for its links.
    return STRAGGLER_STEPS * (1 if big else 4), len(rows) > 1


def workload(
    choice: StepChoice, steps: pa.Table, sc: pa.Table, links: frozenset[str]
) -> WorkloadTables:
    chips = frozenset(c for c in sc.column("chip_id").to_pylist() if c is not None)
    return WorkloadTables(choice, steps, sc, chips, links)


def merge_step_chips(parts: list[pa.Table]) -> pa.Table:
    """`step_chips` of a store's shares (the same sampled steps, each share's own spans)
    as one: a (step, chip) seen in several shares gets its first and last op and its
    summed op and comm time."""
    table = pa.concat_tables(parts, promote_options="permissive")
    keys = list(zip(table["step_id"].to_pylist(), table["chip_id"].to_pylist(), strict=True))
    if len(set(keys)) == len(keys):
        return table
    merged = table.group_by(["step_id", "chip_id"], use_threads=False).aggregate(
        [
            ("chip_type", "max"),
            ("first_ns", "min"),
            ("last_ns", "max"),
            ("op_ns", "sum"),
            ("comm_ns", "sum"),
        ]
    )
    merged = merged.rename_columns(
        [
            k.rsplit("_", 1)[0] if k.endswith(("_max", "_min", "_sum")) else k
            for k in merged.column_names
        ]
    )
    return merged.select(list(_STEP_CHIP_COLUMNS)).cast(pa.schema(_STEP_CHIP_COLUMNS))


def busiest_first(workloads: list[WorkloadTables], busy: dict[str, int]) -> list[WorkloadTables]:
    """Workloads ordered by the busy time of the chips they use, then by step time."""

    def key(w: WorkloadTables) -> tuple[float, float, str]:
        s = w.steps
        steps = sum(e - b for b, e in zip(s["start_ns"].to_pylist(), s["end_ns"].to_pylist()))
        return (-sum(busy.get(c, 0) for c in w.chips), -float(steps), w.name)

    return sorted(workloads, key=key)
