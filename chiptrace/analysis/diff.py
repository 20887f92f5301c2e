"""What changed between two runs: per metric and per finding (pure, over report dicts).

Works on `Report.to_dict()` output, so a saved `chiptrace report --json` file can be one
side of the comparison.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from chiptrace.analysis.findings import SEVERITIES

_RANK = {s: i for i, s in enumerate(SEVERITIES)}


def flatten(metrics: Mapping[str, Any], prefix: str = "") -> dict[str, float | None]:
    """`{"utilization": {"gpu": 0.5}}` -> `{"utilization.gpu": 0.5}`; numbers and None only."""
    out: dict[str, float | None] = {}
    for k, v in metrics.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping):
            out.update(flatten(v, key + "."))
        elif v is None or (isinstance(v, (int, float)) and not isinstance(v, bool)):
            out[key] = v
    return out


def _metric_rows(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[dict[str, Any]]:
    fa, fb = flatten(a), flatten(b)
    rows = []
    for key in list(fa) + [k for k in fb if k not in fa]:
        va, vb = fa.get(key), fb.get(key)
        delta = vb - va if va is not None and vb is not None else None
        ratio = vb / va if va not in (None, 0) and vb is not None else None
        rows.append(
            {
                "metric": key,
                "a": va,
                "b": vb,
                "delta": None if delta is None else round(delta, 6),
                "ratio": None if ratio is None else round(ratio, 4),
            }
        )
    return rows


# Rules that judge against a topology's peaks or bandwidths: a side without a topology
# cannot find them, so their absence there says nothing.
NEEDS_TOPOLOGY = frozenset(
    {"compute-bound", "memory-bound", "precision-opportunity", "link-bound", "link-down"}
)


def _no_topology(report: Mapping[str, Any]) -> bool:
    return report.get("metrics", {}).get("topology") == {"chips": 0, "links": 0}


def _finding_rows(
    a: list[Mapping[str, Any]], b: list[Mapping[str, Any]], blind: bool = False
) -> list[dict[str, Any]]:
    # The same rule and culprit in two workloads (a chip serving both) are two findings.
    ka = {(f["rule"], f["culprit"], f.get("step")): f for f in a}
    kb = {(f["rule"], f["culprit"], f.get("step")): f for f in b}
    rows = []
    for key in list(ka) + [k for k in kb if k not in ka]:
        fa, fb = ka.get(key), kb.get(key)
        if (fa is None or fb is None) and blind and key[0] in NEEDS_TOPOLOGY:
            status = "not judged"  # the side without it has no topology to judge by
        elif fb is None:
            status = "resolved"
        elif fa is None:
            status = "new"
        elif _RANK.get(fb["severity"], 9) < _RANK.get(fa["severity"], 9):
            status = "worse"
        elif _RANK.get(fb["severity"], 9) > _RANK.get(fa["severity"], 9):
            status = "better"
        else:
            status = "same"
        rows.append(
            {
                "rule": key[0],
                "culprit": key[1],
                "step": key[2],
                "status": status,
                "a_severity": fa["severity"] if fa else None,
                "b_severity": fb["severity"] if fb else None,
                "a_share": fa.get("share") if fa else None,
                "b_share": fb.get("share") if fb else None,
                "a_saving_ms": fa.get("saving_ms") if fa else None,
                "b_saving_ms": fb.get("saving_ms") if fb else None,
                "suggestion": (fb or fa or {}).get("suggestion"),
            }
        )
    order = {"new": 0, "worse": 1, "resolved": 2, "better": 3, "same": 4}
    rows.sort(
        key=lambda r: (order.get(r["status"], 5), _RANK.get(r["b_severity"] or r["a_severity"], 9))
    )
    return rows


def diff_reports(a: Mapping[str, Any], b: Mapping[str, Any]) -> dict[str, Any]:
    """Compare two report dicts (A is the baseline).

    Returns:
        ``{"a": sources, "b": sources, "metrics": [{metric, a, b, delta, ratio}],
        "findings": [{rule, culprit, step, status, a_severity, b_severity, a_share,
        b_share, a_saving_ms, b_saving_ms, suggestion}], "notes": [text]}`` with status
        one of new, worse, resolved, better, same, or "not judged" for a rule that needs a
        topology (NEEDS_TOPOLOGY) found on one side only, the other having none (a note
        says which); findings match on (rule, culprit, step).
    """
    blind = [side for side, r in (("A", a), ("B", b)) if _no_topology(r)]
    notes = [
        f"{side} has no topology (chip peaks, link bandwidths): "
        f"{', '.join(sorted(NEEDS_TOPOLOGY))} and MFU are not judged there"
        for side in blind
    ]
    one = len(blind) == 1  # both blind: neither side finds them
    return {
        "a": a.get("sources", []),
        "b": b.get("sources", []),
        "metrics": _metric_rows(a.get("metrics", {}), b.get("metrics", {})),
        "findings": _finding_rows(a.get("findings", []), b.get("findings", []), one),
        "notes": notes,
    }
