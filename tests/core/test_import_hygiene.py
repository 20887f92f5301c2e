"""Layers point one way: importing chiptrace never drags in the viewer, exporters or analysis."""

from __future__ import annotations

import subprocess
import sys


def test_import_chiptrace_stays_light():
    code = (
        "import sys, chiptrace\n"
        "heavy = [m for m in ('textual', 'chiptrace.viewer', 'chiptrace.exporters', "
        "'chiptrace.analysis', 'duckdb') if m in sys.modules]\n"
        "print(','.join(heavy))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_core_modules_do_not_import_upper_layers():
    from pathlib import Path

    import chiptrace

    root = Path(chiptrace.__file__).parent
    for path in root.glob("*.py"):
        text = path.read_text()
        for upper in ("chiptrace.viewer", "chiptrace.analysis", "textual"):
            assert f"import {upper}" not in text and f"from {upper}" not in text, (path, upper)
