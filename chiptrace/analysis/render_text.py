"""Plain-text rendering of a report dict and of a diff dict (what the terminal shows).

Rendering only: these functions read `Report.to_dict()` / `diff_reports()` output and
compute nothing but layout.
"""

from __future__ import annotations

from typing import Any

_MARK = {"high": "!!", "medium": "! ", "low": ". ", "info": "  "}


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{v * 100:.1f}%"


def render_report(d: dict[str, Any], max_findings: int = 20) -> str:
    """The report as terminal text: headline metrics, findings, critical path, chips."""
    m = d["metrics"]
    out = [f"chiptrace report: {', '.join(d.get('sources') or ['(connection)'])}", ""]
    out.append(
        f"  spans {m['spans']:,}   dropped {m['spans_dropped']:,}   wall {m['wall_ms']:.3f} ms"
    )
    if m.get("steps"):
        out.append(
            f"  steps {m['steps']:,}   step p50 {_fmt(m['step_ms_p50'])} ms   "
            f"p99 {_fmt(m['step_ms_p99'])} ms"
        )
    util = "   ".join(f"{k} {_pct(v)}" for k, v in m.get("utilization", {}).items())
    out.append(f"  utilization  {util or '-'}")
    out.append(
        f"  comm share {_pct(m.get('comm_share'))}   on critical path "
        f"{_pct(m.get('critical_path_comm_share'))}   MFU {_pct(m.get('mfu'))}"
    )
    out += ["", "Findings (most severe first)"]
    findings = d.get("findings", [])
    if not findings:
        out.append("  none: no rule found a bottleneck")
    for f in findings[:max_findings]:
        ev = ", ".join(f"{k}={_fmt(v)}" for k, v in f["evidence"].items())
        out.append(
            f" {_MARK.get(f['severity'], '  ')} {f['severity']:<6} {f['rule']:<22} "
            f"{f['culprit']}  ({_pct(f['share'])} at stake)"
        )
        out.append(f"           {ev}")
        out.append(f"           -> {f['suggestion']}")
    if len(findings) > max_findings:
        out.append(f"  ... {len(findings) - max_findings} more (--json shows all)")
    cp = d.get("critical_path")
    if cp:
        out += ["", f"Critical path of the slowest step ({cp['root']}, {cp['duration_ms']:.3f} ms)"]
        for label, key in (
            ("chip type", "by_chip_type"),
            ("link type", "by_link_type"),
            ("op kind", "by_op_kind"),
            ("span", "by_name"),
        ):
            parts = "   ".join(f"{k} {_pct(v)}" for k, v in cp[key].items())
            out.append(f"  by {label:<10} {parts}")
    if not cp and m.get("steps") and not m.get("steps_sampled"):
        out += [
            "",
            "Critical path: not computed (steps too large to walk span by span; "
            "raise --max-step-spans)",
        ]
    med = d.get("critical_path_median")
    if med and cp and med["trace_id"] != cp["trace_id"]:
        parts = "   ".join(f"{k} {_pct(v)}" for k, v in med["by_chip_type"].items())
        out.append(f"  median step ({med['duration_ms']:.3f} ms) by chip type  {parts}")
    if d.get("chips"):
        out += ["", "Chips"]
        for c in d["chips"]:
            out.append(
                f"  {c['chip_id']:<14} {c['chip_type']:<7} util {_pct(c['utilization']):>7}   "
                f"ops {c['ops']:,}"
            )
    return "\n".join(out) + "\n"


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
            f"  {r['metric']:<32} {_fmt(r['a']):>14} {_fmt(r['b']):>14} {_fmt(r['ratio']):>8}"
        )
    out += ["", "Findings"]
    if not d["findings"]:
        out.append("  none in either run")
    for f in d["findings"]:
        sev = f"{f['a_severity'] or '-'} -> {f['b_severity'] or '-'}"
        out.append(f"  {f['status']:<9} {f['rule']:<22} {f['culprit']:<28} {sev}")
    return "\n".join(out) + "\n"
