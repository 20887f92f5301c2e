"""Rules for traces that are not emulated: step-time outliers, host CPU contention, and
error rate and tail latency per endpoint of a service.

These need no topology and no chip tags: a PyTorch loop with one slow step, a program
starved of CPU by its neighbours, a web app answering a quarter of its requests with
errors all show in plain OpenTelemetry spans and the host samples of `chiptrace record`.
"""

from __future__ import annotations

import dataclasses
import re
import statistics
from collections import defaultdict
from typing import Any

from chiptrace.analysis import host_side as hs
from chiptrace.analysis import steps as iv
from chiptrace.analysis.findings import Finding, severity_for
from chiptrace.analysis.rule_input import RuleInput, ms, robust_z
from chiptrace.analysis.workloads import family

OUTLIER = 2.0  # a step at least twice the median ...
OUTLIER_Z = 3.5  # ... and far outside the steps' spread
MIN_STEPS = 4
MIN_EXTRA_NS = 1_000_000  # sub-millisecond hiccups (a GC pause in a 70 us request) are noise
BUSY_HOST = 85.0  # mean CPU utilization (%) of the host's logical CPUs
STARVED_CORES = 0.6  # the program got less than this many cores
ERRORS_MIN = 3  # errors an endpoint must have before its rate means anything
TAIL = 5.0  # p99 at least 5x p50 ...
TAIL_MIN = 50  # ... over at least this many requests
MAX_ENDPOINTS = 20


def _leaf_time(st: iv.Step) -> tuple[dict[str, float], float]:
    """Per op name (numbers dropped): leaf time inside the step; and untraced time."""
    per: dict[str, float] = defaultdict(float)
    ivs = []
    for s in st.leaves():
        a, b = max(s["start_ns"], st.start_ns), min(s["end_ns"], st.end_ns)
        if b > a and s["span_id"] != st.root_id:
            per[family(s["name"] or "")] += b - a
            ivs.append((a, b))
    return per, st.duration_ns - iv.length(iv.union(ivs))


def _extra_on(x: RuleInput) -> dict[str, float]:
    """What the slowest sampled step spent beyond the median one, by op name."""
    if len(x.steps) < 2:
        return {}
    slow, slow_gap = _leaf_time(x.steps[0])
    med, med_gap = _leaf_time(x.steps[1])
    extra = {k: slow.get(k, 0.0) - med.get(k, 0.0) for k in set(slow) | set(med)}
    extra["(untraced)"] = slow_gap - med_gap
    top = sorted(((v, k) for k, v in extra.items() if v > 0), reverse=True)[:3]
    return {k: ms(v) for v, k in top}


def _served_by(x: RuleInput, slow_ids: set[str]) -> tuple[str | None, float]:
    """The chip that served most of the slow steps, where it served few of the others (the
    slow requests all landed on one device), and the share of slow steps it served."""
    by_step: dict[str, set[str]] = defaultdict(set)
    for r in x.tables.step_chips.to_pylist():
        by_step[r["step_id"]].add(r["chip_id"])
    slow = [by_step[s] for s in slow_ids if s in by_step]
    if len(slow) < 3:
        return None, 0.0
    counts: dict[str, int] = defaultdict(int)
    for chips in slow:
        for c in chips:
            counts[c] += 1
    chip = min(counts, key=lambda c: (-counts[c], c))
    overall = sum(chip in chips for chips in by_step.values()) / len(by_step)
    share = counts[chip] / len(slow)
    return (chip, share) if share >= 0.8 and overall <= 0.5 else (None, 0.0)


def step_label(row: dict[str, Any]) -> str:
    """A step by its number: `ProfilerStep#3` as is, a `step` span with step attribute 3
    as `step 3`."""
    name, number = row.get("name") or "", row.get("number")
    if number is None or name.endswith(str(number)):
        return name
    return f"{name} {number}"


def step_outliers(x: RuleInput) -> list[Finding]:
    """The slowest steps against the median, and what they spent the extra on (training
    steps only: a browser's tasks are told by `long_tasks`)."""
    s = x.tables.steps
    if s.num_rows < MIN_STEPS or not x.training:
        return []
    # A warm-up step (one-time work: allocation, compilation) is named by warm-up instead.
    warm = {sh.step.root_id for sh in hs.step_hosts(x) if sh.warm_up}
    keep = [i for i, sid in enumerate(s["span_id"].to_pylist()) if sid not in warm]
    s = s.take(keep) if len(keep) < s.num_rows else s
    if s.num_rows < MIN_STEPS:
        return []
    durs = [max(e - b, 0) for b, e in zip(s["start_ns"].to_pylist(), s["end_ns"].to_pylist())]
    med = statistics.median(durs)
    if med <= 0:
        return []
    outliers = [
        i
        for i, d in enumerate(durs)
        if d >= OUTLIER * med
        and d - med >= MIN_EXTRA_NS
        and robust_z(d, durs, 0.01 * med) >= OUTLIER_Z
    ]
    if not outliers:
        return []
    slow = [durs[i] for i in outliers]
    worst = max(durs)
    names = (
        [step_label(r) for r in s.select(["name", "number"]).to_pylist()]
        if "number" in (s.column_names)
        else s["name"].to_pylist()
    )
    if set(outliers) <= _first_steps(s):
        return [_first_step(x, names[durs.index(worst)], worst, med, len(outliers))]
    ids = s["span_id"].to_pylist()
    chip, on_chip = _served_by(x, {i for i, d in zip(ids, durs) if d >= OUTLIER * med})
    extra = _extra_on(x)
    saving = sum(d - med for d in slow) / len(durs)
    sev = severity_for(saving / x.step_ns if x.step_ns else 0.0)
    where = f"; the extra went to {', '.join(extra)}" if extra else ""
    if chip:
        where = f"; {on_chip:.0%} of them ran on {chip}" + where
    return [
        x.finding(
            "step-outliers",
            chip or x.workload or "steps",
            {
                "served_by": chip,
                "outlier_steps": len(slow),
                "steps": len(durs),
                "slowest_ms": ms(worst),
                "median_ms": ms(med),
                "slowest_vs_median": round(worst / med, 2),
                "slowest_step": names[durs.index(worst)],
                "extra_ms_on": extra,
            },
            f"{len(slow)} of {len(durs)} steps take >= {OUTLIER:g}x the median (slowest "
            f"{worst / med:.0f}x){where}: look for what runs only then (data loading, "
            f"checkpoints, recompilation, garbage collection)",
            saving,
            # One slow step is a one-off (a warm-up, a checkpoint): worth a look, not the
            # worst problem of the run however long it took.
            sev if len(slow) > 1 or sev != "high" else "medium",
        )
    ]


def _first_steps(s: Any) -> set[int]:
    """Row indices of each process's (rank's) first step."""
    procs = s["proc"].to_pylist() if "proc" in s.column_names else [None] * s.num_rows
    first: dict[Any, int] = {}
    for i, (p, t) in enumerate(zip(procs, s["start_ns"].to_pylist(), strict=True)):
        if p not in first or t < s["start_ns"][first[p]].as_py():
            first[p] = i
    return set(first.values())


def _first_step(x: RuleInput, name: str, worst: float, med: float, n: int) -> Finding:
    """Only the first step of each rank stands out: a warm-up (lazy set-up, allocator
    growth, compilation, autotuning), not a recurring problem; info."""
    return x.finding(
        "warm-up",
        name,
        {
            "first_steps_slow": n,
            "slowest_ms": ms(worst),
            "median_ms": ms(med),
            "slowest_vs_median": round(worst / med, 2),
            "extra_ms_on": _extra_on(x),
        },
        f"only the first step stands out ({name}, {worst / med:.0f}x the median): a warm-up "
        f"(lazy set-up, allocation, compilation, autotuning); judge the loop by its steady "
        f"steps (skip the first: torch.profiler.schedule(wait=1, warmup=1, ...) does)",
        0.0,
        "info",
    )


LONG_TASK_NS = 50_000_000  # the web's long-task threshold (the Long Tasks API): 50 ms
# Top-level work of a thread: a root span of internal kind (a request is a server span:
# its latency is the endpoints' business), longer than the threshold, by name.
_LONG_TASKS_SQL = """
SELECT CAST(name AS VARCHAR) AS name, count(*) AS n, max(end_ns - start_ns) AS longest,
       CAST(sum(end_ns - start_ns - {limit}) AS DOUBLE) AS over,
       arg_max(concat_ws(' ', CAST(service AS VARCHAR), 'pid ' || pid,
                         'thread ' || json_extract_string(attributes, '$."thread.id"')),
               end_ns - start_ns) AS where_
FROM spans_raw
WHERE parent_span_id IS NULL AND link_id IS NULL AND coalesce(kind, 0) IN (0, 1)
  AND NOT coalesce(contains(attributes, '"kineto.cat"'), false)
  AND json_extract_string(attributes, '$."thread.id"') IS NOT NULL
  AND end_ns - start_ns >= {limit} AND end_ns >= {lo} AND start_ns < {hi}
GROUP BY 1 ORDER BY over DESC, name"""


def long_tasks(x: RuleInput) -> list[Finding]:
    """A trace that shows no training (a browser's, a tool's): its threads' top-level
    tasks that ran 50 ms or more, each blocking its thread that long. Said in the tasks'
    own words, at low severity: worth a look, not a training bottleneck. Only spans that
    name their thread are tasks of one (a service's requests are the endpoints' business;
    a PyTorch profiler trace's roots are ops and the profiler's own range)."""
    t = x.tables
    if x.con is None or any(w.training for w in t.workloads):
        return []
    rows = x.con.sql(_LONG_TASKS_SQL.format(limit=LONG_TASK_NS, lo=t.lo, hi=t.hi)).fetchall()
    if not rows:
        return []
    n = sum(r[1] for r in rows)
    over = sum(r[3] for r in rows)
    name, _, longest, _, where = max(rows, key=lambda r: (r[2], r[0]))
    top = ", ".join(f"{r[0]} ({r[1]})" for r in rows[:3])
    f = x.finding(
        "long-tasks",
        name,
        {
            "long_tasks": n,
            "by_name": {r[0]: r[1] for r in rows[:10]},
            "longest_ms": ms(longest),
            "longest_on": where,
            "over_50ms_ms": ms(over),
        },
        f"{n} top-level tasks ran 50 ms or more ({top}; longest {name}, "
        f"{longest / 1e6:,.0f} ms on {where}), each blocking its thread meanwhile: split "
        f"them or move the work off that thread",
        over,
        "low",
    )
    return [dataclasses.replace(f, step=None)]  # about the run's threads, not a workload


def _table_exists(con: Any, name: str) -> bool:
    q = "SELECT count(*) FROM information_schema.tables WHERE table_name = ?"
    return bool(con.execute(q, [name]).fetchall()[0][0])


def host_contention(x: RuleInput) -> list[Finding]:
    """The host's CPUs busy while the traced program got a fraction of a core (the
    `metrics` samples of `chiptrace record` / `init(sample_host=True)`)."""
    t = x.tables
    if x.con is None or not _table_exists(x.con, "metrics"):
        return []
    rows = x.con.execute(
        """SELECT host, avg(value) FILTER (WHERE metric = 'cpu.util'),
                  count(DISTINCT chip_id) FILTER (WHERE metric = 'cpu.util'),
                  avg(value) FILTER (WHERE metric = 'proc.cpu') / 100,
                  count(*) FILTER (WHERE metric = 'proc.cpu')
           FROM metrics WHERE ts_ns BETWEEN ? AND ? GROUP BY host ORDER BY host""",
        [t.t0, t.t1],
    ).fetchall()
    out = []
    for host, util, cpus, cores, samples in rows:
        if util is None or cores is None or util < BUSY_HOST or cores >= STARVED_CORES:
            continue
        # Upper bound: a CPU-bound program on a free core runs 1/cores times faster.
        saving = x.step_ns * (1 - cores)
        out.append(
            x.finding(
                "host-contention",
                f"cpu on {host}",
                {
                    "host_cpu_util_pct": round(util, 1),
                    "logical_cpus": cpus,
                    "program_cores": round(cores, 3),
                    "samples": samples,
                },
                f"{host}'s {cpus} CPUs were {util:.0f}% busy while the program got "
                f"{cores:.2f} of a core: stop or move what else runs there, or pin the program "
                f"to free cores",
                saving,
                "high" if util >= 95 and cores < 0.5 else None,
            )
        )
    return out


ENDPOINTS_SQL = """
WITH e AS (
    SELECT CAST(name AS VARCHAR) AS name, kind = 2 AS server, kind IN (3, 4, 5) AS remote,
           status_code, CAST(status_message AS VARCHAR) AS msg,
           coalesce(regexp_matches(attributes, '"(http|url|rpc|server)[.]'), false) AS web,
           greatest(least(end_ns, {hi}) - greatest(start_ns, {lo}), 0) AS d
    FROM spans_raw WHERE {where} AND (kind = 2 OR parent_span_id IS NULL))
SELECT name, server, count(*) AS requests, count(*) FILTER (WHERE status_code = 2) AS errors,
       quantile_cont(d, 0.5) AS p50, quantile_cont(d, 0.95) AS p95,
       quantile_cont(d, 0.99) AS p99, avg(d) AS mean,
       avg(d) FILTER (WHERE status_code = 2) AS error_mean,
       mode(msg) FILTER (WHERE status_code = 2) AS message, bool_or(remote OR web) AS service
FROM e GROUP BY name, server"""
# A root named like a request: an HTTP method and a path, or a path.
_REQUEST_NAME = re.compile(r"^((GET|POST|PUT|DELETE|PATCH|HEAD|OPTIONS)\s|/)")


def endpoints(con: Any, lo: int, hi: int, where: str) -> list[dict[str, Any]]:
    """Per endpoint (server spans, else root spans): requests, errors, error rate and
    latency percentiles (ms), the busiest MAX_ENDPOINTS. One pass over the store.

    Root spans are endpoints only in a service's trace (client/producer/consumer kinds,
    HTTP/RPC attributes, roots named like requests); elsewhere (a training loop, a profiler
    trace whose roots are steps and stray kernels) only roots that failed are listed."""
    rows = con.sql(ENDPOINTS_SQL.format(lo=lo, hi=hi, where=where)).fetchall()
    servers = any(r[1] for r in rows)
    rows = [r for r in rows if bool(r[1]) == servers]
    if not servers and not any(r[10] or _REQUEST_NAME.match(r[0] or "") for r in rows):
        rows = [r for r in rows if r[3]]
    rows.sort(key=lambda r: (-r[2], r[0]))
    out = []
    for name, _, n, errors, p50, p95, p99, mean, emean, msg, _ in rows[:MAX_ENDPOINTS]:
        out.append(
            {
                "name": name,
                "kind": "server" if servers else "root",
                "requests": n,
                "errors": errors,
                "error_rate": round(errors / n, 4) if n else 0.0,
                "p50_ms": ms(p50),
                "p95_ms": ms(p95),
                "p99_ms": ms(p99),
                "mean_ms": ms(mean),
                "error_mean_ms": ms(emean),
                "error_message": msg,
            }
        )
    return out


def service(x: RuleInput, table: list[dict[str, Any]]) -> list[Finding]:
    """Endpoints that answer with errors, or whose slowest requests are far slower than
    the typical one."""
    out = []
    for e in table:
        rate = e["error_rate"]
        if e["errors"] >= ERRORS_MIN and rate >= 0.01:
            sev = "high" if rate >= 0.10 else "medium" if rate >= 0.02 else "low"
            f = x.finding(
                "error-rate",
                e["name"],
                {k: e[k] for k in ("requests", "errors", "error_rate", "p50_ms", "p99_ms")}
                | {"error_message": e["error_message"]},
                f"{rate:.0%} of {e['name']} requests fail"
                + (f" ({e['error_message']})" if e["error_message"] else "")
                + ": fix the cause or shed load before it, and alert on the rate",
                rate * (e["error_mean_ms"] or 0.0) * 1e6,
                sev,
            )
            out.append(_about(f, e["name"], rate))
        p50, p99 = e["p50_ms"] or 0.0, e["p99_ms"] or 0.0
        if e["requests"] >= TAIL_MIN and p50 > 0 and p99 >= TAIL * p50:
            saving = (e["mean_ms"] - p50) * 1e6
            f = x.finding(
                "tail-latency",
                e["name"],
                {k: e[k] for k in ("requests", "p50_ms", "p95_ms", "p99_ms", "mean_ms")},
                f"{e['name']}: p99 {p99:.1f} ms is {p99 / p50:.0f}x p50 {p50:.1f} ms: find what "
                f"the slow requests share (a lock, a cold cache, a retry, one backend)",
                saving,
                "medium" if p99 >= 4 * TAIL * p50 else "low",
            )
            out.append(_about(f, e["name"], saving / (e["mean_ms"] * 1e6)))
    return out


def _about(f: Finding, endpoint: str, share: float) -> Finding:
    """An endpoint finding is about that endpoint's requests: its share is of them."""
    share = min(max(share, 0.0), 1.0)
    sev = f.severity if f.rule == "error-rate" else f.severity or severity_for(share)
    return Finding(f.rule, sev, f.culprit, f.evidence, f.suggestion, share, f.saving_ns, endpoint)
