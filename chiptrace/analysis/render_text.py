"""Plain-text rendering of a report dict and of a diff dict (what the terminal shows).

Rendering only: these functions read `Report.to_dict()` / `diff_reports()` output and
compute nothing but layout.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from chiptrace.analysis.short_names import short_name, shorten_in

_MARK = {"high": "!!", "medium": "! ", "low": ". ", "info": "  "}


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:,.0f}" if abs(v) >= 1e4 else f"{v:.4g}"
    return str(v)


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{v * 100:.1f}%"


def _s(v: Any) -> str:
    """Any value as text (a NULL chip type from foreign spans prints as '-')."""
    return "-" if v is None else str(v)


def _steps_lines(d: dict[str, Any]) -> list[str]:
    out = []
    for w in d.get("workloads") or []:
        if w.get("training") is False:
            out.append(
                f"  tasks {_s(w['step'])!r}: {w['steps']:,}, p50 {_fmt(w['step_ms_p50'])} ms, "
                f"p99 {_fmt(w['step_ms_p99'])} ms (not training steps: no ProfilerStep, step "
                f"attribute, --step or device work under them)"
            )
            out.append(f"     chosen: {_s(w['reason'])}")
            continue
        ranks = w.get("ranks") or 1
        per = f" ({ranks} ranks x {w['steps'] / ranks:,.4g})" if ranks > 1 else ""
        out.append(
            f"  step {_s(w['step'])!r}: {w['steps']:,} step{'' if w['steps'] == 1 else 's'}{per}, "
            f"p50 {_fmt(w['step_ms_p50'])} ms, p99 {_fmt(w['step_ms_p99'])} ms, "
            f"comm share {_pct(w.get('comm_share'))}"
        )
        out.append(f"     chosen: {_s(w['reason'])}")
    return out or ["  steps: none found (no span has children; --step GLOB names them)"]


def _finding_lines(f: dict[str, Any]) -> list[str]:
    ev = ", ".join(f"{_s(k)}={_fmt(v)}" for k, v in f["evidence"].items())
    where = f" [{_s(f['step'])}]" if f.get("step") else ""
    if f.get("saving_ms"):
        per = "/step" if f.get("step") else ""
        stake = f"saves ~{_fmt(f['saving_ms'])} ms{per} ({_fmt(f.get('saving_pct'))}%)"
    else:
        stake = f"({_pct(f.get('share'))} at stake)"
    culprit = _s(f["culprit"])
    short = short_name(culprit)
    return [
        f" {_MARK.get(f['severity'], '  ')} {_s(f['severity']):<6} {_s(f.get('kind') or ''):<11} "
        f"{_s(f['rule']):<22} "
        f"{short}{where}  {stake}",
        f"           {ev}",
        f"           -> {shorten_in(_s(f['suggestion']).replace(culprit, short))}",
    ]


NO_TOPOLOGY = (
    "no topology recorded (chip peaks, link bandwidths): MFU, roofline and link-bandwidth "
    "rules are not judged (emulate records one; an imported or round-tripped trace has none)"
)


def render_report(d: dict[str, Any], max_findings: int = 20) -> str:
    """The report as terminal text: headline metrics, findings, critical path, chips."""
    m = d["metrics"]
    out = [f"chiptrace report: {', '.join(d.get('sources') or ['(connection)'])}", ""]
    out.append(
        f"  spans {m['spans']:,}   dropped {m['spans_dropped']:,}   wall {m['wall_ms']:.3f} ms"
    )
    out += _steps_lines(d)
    util = "   ".join(f"{_s(k)} {_pct(v)}" for k, v in m.get("utilization", {}).items())
    out.append(f"  utilization  {util or '-'}")
    out.append(
        f"  comm share {_pct(m.get('comm_share'))}   on critical path "
        f"{_pct(m.get('critical_path_comm_share'))}   MFU {_pct(m.get('mfu'))}"
    )
    if m.get("topology") == {"chips": 0, "links": 0}:
        out.append(f"  {NO_TOPOLOGY}")
    out += [
        "",
        "Findings (faults, bottlenecks, opportunities; most severe first; across workloads)",
    ]
    findings = d.get("findings", [])
    if not findings:
        out.append("  none: no rule found a bottleneck")
    for f in findings[:max_findings]:
        out += _finding_lines(f)
    if len(findings) > max_findings:
        out.append(f"  ... {len(findings) - max_findings} more (--json shows all)")
    out += _path_lines(d)
    out += _kernel_lines(d.get("kernels") or {})
    out += _launch_lines(d.get("launch") or [], d["metrics"].get("ranks") or [])
    out += _endpoint_lines(d.get("endpoints") or [])
    out += _breakdown_lines(d.get("time_breakdown") or [])
    if d.get("chips"):
        out += ["", "Chips"]
        for c in d["chips"]:
            out.append(
                f"  {_s(c['chip_id']):<14} {_s(c['chip_type']):<7} util "
                f"{_pct(c['utilization']):>7}   ops {c['ops']:,}"
            )
    out += _link_lines(d.get("links") or [])
    return "\n".join(out) + "\n"


MAX_LINKS = 10


def _breakdown_lines(rows: list[dict[str, Any]]) -> list[str]:
    if not rows:
        return []
    out = ["", "Time by process, thread and span (self: less the time of its children)"]
    out.append(f"  {'process':<22} {'thread':<10} {'span':<44} {'count':>7} {'self ms':>11} share")
    for r in rows:
        out.append(
            f"  {short_name(_s(r['process']), 22):<22} {short_name(_s(r['thread']), 10):<10} "
            f"{short_name(_s(r['name']), 44):<44} {r['count']:>7,} {_fmt(r['self_ms']):>11} "
            f"{_pct(r['self_share']):>6}"
        )
    return out


def _link_lines(links: list[dict[str, Any]]) -> list[str]:
    """The busiest link directions: the rate achieved while busy, against the link's
    bandwidth where the topology gives it (else said to be unknown, never guessed)."""
    if not links:
        return []
    rows = sorted(links, key=lambda r: (-(r.get("busy_share") or 0), _s(r["link_id"])))
    out = ["", "Links (busiest directions; rate while busy)"]
    for r in rows[:MAX_LINKS]:
        bw = r.get("bandwidth_GBps")
        peak = (
            f"of {bw:g} GB/s ({_pct(r.get('bandwidth_fraction_while_busy'))})"
            if bw
            else "peak unknown (no topology gives its bandwidth)"
        )
        out.append(
            f"  {_s(r['link_id'])} {_s(r['src'])}->{_s(r['dst'])}   {r['transfers']:,} transfers"
            f"   {(r['bytes'] or 0) / 1e6:,.1f} MB   busy {_pct(r.get('busy_share'))}"
            f"   {_fmt(r.get('GBps_while_busy'))} GB/s {peak}"
        )
    if len(rows) > MAX_LINKS:
        out.append(f"  ... {len(rows) - MAX_LINKS} more (--json shows all)")
    return out


def _path_lines(d: dict[str, Any]) -> list[str]:
    m, cp = d["metrics"], d.get("critical_path")
    out: list[str] = []
    if cp:
        tail = ""
        if cp.get("root_ms") is not None and cp["root_ms"] < cp["duration_ms"]:
            tail = f": its span {cp['root_ms']:.3f} ms, then device work it launched"
        out += [
            "",
            f"Critical path of the slowest step ({_s(cp['root'])}, "
            f"{cp['duration_ms']:.3f} ms{tail})",
        ]
        for label, key in (
            ("chip type", "by_chip_type"),
            ("link type", "by_link_type"),
            ("op kind", "by_op_kind"),
            ("span", "by_name"),
        ):
            parts = "   ".join(f"{short_name(_s(k), 50)} {_pct(v)}" for k, v in cp[key].items())
            out.append(f"  by {label:<10} {parts}")
        if "gap" in cp["by_chip_type"]:
            out.append(
                "  gap: time on the path that no traced span covers (code the trace does not "
                "record: untraced Python, waits outside the trace, a GPU idle between kernels)"
            )
    training = ((d.get("workloads") or [{}])[0]).get("training", True)
    if not cp and m.get("steps") and not m.get("steps_sampled") and training:
        out += [
            "",
            "Critical path: not computed (steps too large to walk span by span; "
            "raise --max-step-spans)",
        ]
    med = d.get("critical_path_median")
    if med and cp and med["trace_id"] != cp["trace_id"]:
        parts = "   ".join(f"{_s(k)} {_pct(v)}" for k, v in med["by_chip_type"].items())
        out.append(f"  median step ({med['duration_ms']:.3f} ms) by chip type  {parts}")
    return out


def _kernel_lines(k: dict[str, Any]) -> list[str]:
    if not k.get("kernels"):
        return []
    kinds = "   ".join(
        f"{r['kind']} {_pct(r['share'])} ({r['kernels']:,})" for r in k.get("by_kind") or []
    )
    out = [
        "",
        f"Device work ({k['kernels']:,} ops on {k['chips']} GPU/NPU chip"
        f"{'' if k['chips'] == 1 else 's'}, {k['time_ms']:,.3f} ms summed)",
        f"  by kind    {kinds}",
        f"  {'top':<72} {'kind':<8} {'count':>7} {'ms':>10} {'share':>7} {'mean us':>9}",
    ]
    for r in k.get("top") or []:
        out.append(
            f"  {short_name(r['name']):<72} {_s(r['kind']):<8} {r['kernels']:>7,} "
            f"{r['time_ms']:>10.3f} {_pct(r['share']):>7} {_fmt(r['mean_us']):>9}"
        )
    return out


def _launch_lines(rows: list[dict[str, Any]], ranks: list[dict[str, Any]]) -> list[str]:
    """Per rank: its GPU time breakdown, its busiest stream's launch queue and idle time."""
    if not rows and not ranks:
        return []
    by_rank: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        by_rank[r["rank"]].append(r)
    out = [
        "",
        "Ranks (HTA's definitions): GPU idle / compute / other, comm overlapped by compute; "
        "the busiest stream's launch queue mean / max, launch delay p50, idle waiting for "
        "the host",
    ]
    breakdown = {r["rank"]: r for r in ranks}
    for rank in sorted(set(by_rank) | set(breakdown)):
        line = f"  rank {rank:<4}"
        b = breakdown.get(rank)
        if b:
            line += (
                f" idle {_fmt(b['gpu_idle_pct'])}%  compute {_fmt(b['gpu_compute_pct'])}%  "
                f"other {_fmt(b['gpu_non_compute_pct'])}%  overlap "
                f"{_fmt(b['comm_compute_overlap_pct'])}{'%' if b['comm_compute_overlap_pct'] is not None else ''}"
            )
        if by_rank.get(rank):
            r = max(by_rank[rank], key=lambda x: (x["launches"], -x["stream"]))
            idle = r["host_wait_ms"] + r["kernel_wait_ms"] + r["other_wait_ms"]
            share = f"{r['host_wait_ms'] / idle:.0%}" if idle > 0 else "-"
            line += (
                f"   {_s(r['chip_id'])} stream {r['stream']}: {r['launches']:,} launches, "
                f"queue {_fmt(r['queue_length_mean'])} / {_fmt(r['queue_length_max'])}, "
                f"delay {_fmt(r['launch_delay_us_p50'])} us, host wait {share} of "
                f"{idle:,.1f} ms idle"
            )
        out.append(line)
    return out


def _endpoint_lines(rows: list[dict[str, Any]]) -> list[str]:
    if not rows or not any(r["errors"] for r in rows) and len(rows) < 2:
        return []
    out = ["", f"Endpoints ({rows[0]['kind']} spans): requests, errors, latency p50/p95/p99 ms"]
    for r in rows[:10]:
        out.append(
            f"  {_s(r['name'])[:40]:<40} {r['requests']:>8,} {_pct(r['error_rate']):>7} "
            f"{_fmt(r['p50_ms']):>9} {_fmt(r['p95_ms']):>9} {_fmt(r['p99_ms']):>9}"
        )
    return out


def render_diff(d: dict[str, Any], all_metrics: bool = False) -> str:
    """A diff as terminal text: metrics that changed, then findings new/worse/resolved."""
    out = [
        f"chiptrace diff: A={', '.join(d['a']) or '-'}  B={', '.join(d['b']) or '-'}",
        "",
        f"  {'metric':<32} {'A':>14} {'B':>14} {'B/A':>8}",
    ]
    for r in d["metrics"]:
        if not all_metrics and r["delta"] in (0, None) and r["a"] == r["b"]:
            continue
        out.append(
            f"  {_s(r['metric']):<32} {_fmt(r['a']):>14} {_fmt(r['b']):>14} {_fmt(r['ratio']):>8}"
        )
    out += [f"  {note}" for note in d.get("notes", [])]
    out += ["", "Findings"]
    if not d["findings"]:
        out.append("  none in either run")
    for f in d["findings"]:
        sev = f"{f['a_severity'] or '-'} -> {f['b_severity'] or '-'}"
        where = f" [{f['step']}]" if f.get("step") else ""
        out.append(f"  {f['status']:<10} {_s(f['rule']):<22} {_s(f['culprit']) + where:<40} {sev}")
    return "\n".join(out) + "\n"
