"""Render benchmarks/results/*.json into README.md's benchmark table (`make bench`).

The table sits between `<!-- bench:start -->` and `<!-- bench:end -->`; everything else
in the README is left as it is. Usage: python3 benchmarks/_table.py [README]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
START, END = "<!-- bench:start -->", "<!-- bench:end -->"


def _num(value: float | None, unit: str = "") -> str:
    if value is None:
        return ""
    text = f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"
    return f"{text} {unit}".strip()


def rows(results: Path) -> list[str]:
    """Markdown table lines for every results file, in name order."""
    out = [
        "| figure | chiptrace | peer | ratio (x better) | target | date | machine |",
        "|---|---|---|---|---|---|---|",
    ]
    for path in sorted(results.glob("*.json")):
        doc = json.loads(path.read_text())
        for f in doc["figures"]:
            verdict = {True: "met", False: "**MISSED**"}.get(f.get("met"), "")
            target = f"{'ratio ' if f.get('of') == 'ratio' else ''}{f.get('target', '')}"
            peer = f"{_num(f.get('peer'), f['unit'])} {f.get('peer_name', '')}".strip()
            out.append(
                "| {} | {} | {} | {} | {} | {} | {} |".format(
                    f"{doc['benchmark']}: {f['figure']}",
                    _num(f["chiptrace"], f["unit"]),
                    peer,
                    f"{f['ratio']:.1f}x" if f.get("ratio") else "",
                    f"{target} {verdict}".strip(),
                    doc["date"],
                    doc["machine"] + (f" ({doc['mode']})" if doc.get("mode") else ""),
                )
            )
    return out


def render(readme: Path, results: Path = HERE / "results") -> None:
    """Replace the README's benchmark block with the table of `results`."""
    text = readme.read_text()
    if START not in text or END not in text:
        raise SystemExit(f"{readme}: no {START} ... {END} block to fill")
    head, rest = text.split(START, 1)
    _, tail = rest.split(END, 1)
    block = "\n".join([START, *rows(results), END])
    readme.write_text(head + block + tail)


if __name__ == "__main__":
    render(Path(sys.argv[1]) if len(sys.argv) > 1 else HERE.parent / "README.md")
