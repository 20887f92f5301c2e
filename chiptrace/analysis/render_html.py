"""A self-contained HTML report with inline SVG plots (no scripts, no external files).

Rendering only: reads `Report.to_dict()` output. Plots: utilization over time per chip
type (one line each), and the critical path's breakdown by chip type, link type, op kind.
"""

from __future__ import annotations

import html
from typing import Any

from chiptrace.analysis.short_names import short_name

_COLORS = {
    "gpu": "#2f7ed8",
    "cpu": "#8bbc21",
    "dpu": "#910000",
    "npu": "#1aadce",
    "nic": "#492970",
    "switch": "#f28f43",
    "gap": "#bbbbbb",
    "-": "#dddddd",
}
_CYCLE = ("#77a1e5", "#c42525", "#a6c96a", "#e4d354", "#7cb5ec", "#434348", "#90ed7d")
_SEV = {"high": "#c0392b", "medium": "#e67e22", "low": "#2980b9", "info": "#7f8c8d"}
_CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:2em;max-width:1100px;color:#222}
h1{font-size:1.4em}h2{font-size:1.15em;margin-top:1.6em;border-bottom:1px solid #ddd}
table{border-collapse:collapse}td,th{padding:3px 10px;border-bottom:1px solid #eee;text-align:left}
td.n{text-align:right;font-variant-numeric:tabular-nums}.sev{color:#fff;border-radius:3px;padding:1px 6px}
.ev{color:#555;font-size:12px}svg text{font:11px system-ui,sans-serif}
"""


def _color(key: str, i: int) -> str:
    return _COLORS.get(key, _CYCLE[i % len(_CYCLE)])


def _e(v: Any) -> str:
    return html.escape("-" if v is None else str(v))


def _name(v: Any, width: int = 70) -> str:
    """A long (C++) name shortened, the full one in its tooltip."""
    full = "-" if v is None else str(v)
    short = short_name(full, width)
    return _e(short) if short == full else f'<span title="{_e(full)}">{_e(short)}</span>'


def utilization_svg(util: dict[str, Any], width: int = 900, height: int = 240) -> str:
    """Line chart: utilization (0..100%) over time, one line per chip type."""
    series = util.get("series") or {}
    if not series:
        return "<p>No chip-tagged spans: nothing to plot.</p>"
    left, bottom, top, right = 40, 24, 10, 90
    w, h = width - left - right, height - top - bottom
    n = max(len(v) for v in series.values())
    win = util.get("window_ms") or 1
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}">']
    for pct in (0, 50, 100):
        y = top + h - h * pct / 100
        parts.append(f'<line x1="{left}" x2="{left + w}" y1="{y:.1f}" y2="{y:.1f}" stroke="#ddd"/>')
        parts.append(f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end">{pct}%</text>')
    total_ms = n * win
    parts.append(f'<text x="{left}" y="{height - 6}">0 ms</text>')
    parts.append(
        f'<text x="{left + w}" y="{height - 6}" text-anchor="end">{total_ms:.1f} ms</text>'
    )
    for i, (ctype, vals) in enumerate(series.items()):
        pts = " ".join(
            f"{left + w * (k + 0.5) / n:.1f},{top + h - h * min(v, 1.0):.1f}"
            for k, v in enumerate(vals)
        )
        c = _color(ctype, i)
        parts.append(f'<polyline fill="none" stroke="{c}" stroke-width="1.6" points="{pts}"/>')
        parts.append(
            f'<text x="{left + w + 8}" y="{top + 14 * (i + 1)}" fill="{c}">{_e(ctype)}</text>'
        )
    parts.append("</svg>")
    return "".join(parts)


def breakdown_svg(shares: dict[str, dict[str, float]], width: int = 900) -> str:
    """Stacked horizontal bars, one per grouping (chip type, link type, op kind)."""
    rows = [(label, s) for label, s in shares.items() if s]
    if not rows:
        return "<p>No critical path (no step with children was found).</p>"
    left, bar, gap = 90, 22, 30
    w = width - left - 10
    height = len(rows) * (bar + gap) + 10
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}">']
    for r, (label, s) in enumerate(rows):
        y = 5 + r * (bar + gap)
        parts.append(f'<text x="0" y="{y + 15}">{_e(label)}</text>')
        x = float(left)
        for i, (key, v) in enumerate(s.items()):
            bw = w * v
            c = _color(key, i)
            parts.append(
                f'<rect x="{x:.1f}" y="{y}" width="{bw:.1f}" height="{bar}" fill="{c}">'
                f"<title>{_e(key)}: {v:.1%}</title></rect>"
            )
            if bw > 50:
                parts.append(f'<text x="{x + 3:.1f}" y="{y + bar + 12}">{_e(key)} {v:.0%}</text>')
            x += bw
    parts.append("</svg>")
    return "".join(parts)


def _findings_table(findings: list[dict[str, Any]]) -> str:
    if not findings:
        return "<p>No findings: no rule found a bottleneck.</p>"
    rows = [
        "<table><tr><th>severity</th><th>rule</th><th>culprit</th><th>step</th>"
        "<th>saves per step</th><th>evidence and suggestion</th></tr>"
    ]
    for f in findings:
        ev = ", ".join(f"{_e(k)}={_e(v)}" for k, v in f["evidence"].items())
        saving = f.get("saving_ms")
        saves = f"{saving:.4g} ms ({f['share']:.1%})" if saving else f"{f['share']:.1%}"
        rows.append(
            f'<tr><td><span class="sev" style="background:{_SEV.get(f["severity"], "#777")}">'
            f"{_e(f['severity'])}</span></td><td>{_e(f['rule'])}</td><td>{_name(f['culprit'])}</td>"
            f'<td>{_e(f.get("step"))}</td><td class="n">{_e(saves)}</td><td>{_e(f["suggestion"])}'
            f'<div class="ev">{ev}</div></td></tr>'
        )
    return "".join(rows) + "</table>"


def _metrics_table(m: dict[str, Any]) -> str:
    rows = []
    for k, v in m.items():
        if isinstance(v, dict):
            v = ", ".join(f"{a}: {b}" for a, b in v.items()) or "-"
        rows.append(f'<tr><td>{_e(k)}</td><td class="n">{_e(v)}</td></tr>')
    return "<table>" + "".join(rows) + "</table>"


def _rows_table(rows: list[dict[str, Any]], empty: str) -> str:
    if not rows:
        return f"<p>{_e(empty)}</p>"
    head = "".join(f"<th>{_e(k)}</th>" for k in rows[0])
    body = "".join(
        "<tr>"
        + "".join(
            f'<td class="{"n" if isinstance(v, (int, float)) else ""}">{_e(v)}</td>'
            for v in r.values()
        )
        + "</tr>"
        for r in rows
    )
    return f"<table><tr>{head}</tr>{body}</table>"


def _kernels_section(k: dict[str, Any]) -> list[str]:
    if not k.get("kernels"):
        return []
    rows = [
        "<table><tr><th>kernel</th><th>kind</th><th>count</th><th>ms</th><th>share</th>"
        "<th>mean us</th><th>chips</th></tr>"
    ]
    for r in k.get("top") or []:
        rows.append(
            f"<tr><td>{_name(r['name'])}</td><td>{_e(r['kind'])}</td>"
            + "".join(
                f'<td class="n">{_e(r[c])}</td>'
                for c in ("kernels", "time_ms", "share", "mean_us", "chips")
            )
            + "</tr>"
        )
    return [
        "<h2>Device work by kind</h2>",
        f"<p>{k['kernels']:,} kernels, copies and syncs on {k['chips']} chips, "
        f"{k['time_ms']:,.3f} ms summed.</p>",
        _rows_table(k.get("by_kind") or [], "No device work."),
        "<h2>Top kernels</h2>",
        "".join(rows) + "</table>",
    ]


def _optional(title: str, rows: list[dict[str, Any]] | None) -> list[str]:
    """A section shown only when it has rows (launch queues, endpoints)."""
    return [f"<h2>{_e(title)}</h2>", _rows_table(rows, "")] if rows else []


def _median_section(med: dict[str, Any] | None, cp: dict[str, Any] | None) -> list[str]:
    if not med or (cp and med["trace_id"] == cp["trace_id"]):
        return []
    shares = {
        "chip type": med["by_chip_type"],
        "link type": med["by_link_type"],
        "op kind": med["by_op_kind"],
    }
    return [
        "<h2>Critical path of the median step</h2>",
        f"<p>{_e(med['root'])}: {med['duration_ms']:.3f} ms</p>",
        breakdown_svg(shares),
    ]


def render_html(d: dict[str, Any]) -> str:
    """The whole report as one HTML page."""
    cp = d.get("critical_path")
    shares = {}
    if cp:
        shares = {
            "chip type": cp["by_chip_type"],
            "link type": cp["by_link_type"],
            "op kind": cp["by_op_kind"],
        }
    title = "chiptrace report: " + ", ".join(d.get("sources") or ["(connection)"])
    body = [
        f"<h1>{_e(title)}</h1>",
        "<h2>Steps</h2>",
        _rows_table(
            [
                {
                    k: w.get(k)
                    for k in ("step", "training", "steps", "ranks", "step_ms_p50", "step_ms_p99")
                }
                | {"reason": w.get("reason")}
                for w in d.get("workloads") or []
            ],
            "No steps found (no span has children); --step GLOB names them.",
        ),
        "<h2>Findings (across workloads, the worst first)</h2>",
        _findings_table(d.get("findings", [])),
        "<h2>Headline metrics</h2>",
        _metrics_table(d.get("metrics", {})),
        "<h2>Utilization over time, per chip type</h2>",
        utilization_svg(d.get("utilization", {})),
        "<h2>Critical path of the slowest step</h2>",
        f"<p>{_e(cp['root'])}: {cp['duration_ms']:.3f} ms, trace {_e(cp['trace_id'])}</p>"
        if cp
        else "",
        breakdown_svg(shares),
        "<p>gap: time on the path no traced span covers (untraced code, waits outside the "
        "trace, a GPU idle between kernels).</p>"
        if cp and "gap" in cp["by_chip_type"]
        else "",
        *_median_section(d.get("critical_path_median"), cp),
        *_kernels_section(d.get("kernels") or {}),
        *_optional("Launch queue per rank and stream (HTA's definitions)", d.get("launch")),
        "<h2>Chips</h2>",
        _rows_table(d.get("chips", []), "No chip-tagged spans."),
        "<h2>Links</h2>",
        "<p>bandwidth_GBps empty: no topology gives the link's bandwidth; the peak is "
        "unknown and the link is not judged saturated.</p>"
        if any(r.get("bandwidth_GBps") is None for r in d.get("links") or [])
        else "",
        _rows_table(d.get("links", []), "No link transfers."),
        *_optional("Endpoints", d.get("endpoints")),
        *_optional("Time by process, thread and span (self time)", d.get("time_breakdown")),
    ]
    return (
        f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{_e(title)}</title>"
        f"<style>{_CSS}</style></head><body>{''.join(body)}</body></html>\n"
    )
