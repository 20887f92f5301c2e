"""`import chiptrace` must not import Textual; the viewer must."""

from __future__ import annotations

import subprocess
import sys


def _modules_after(stmt: str) -> set[str]:
    code = f"import sys; {stmt}; print('\\n'.join(sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return set(out.stdout.split())


def test_core_and_cli_do_not_import_textual() -> None:
    mods = _modules_after("import chiptrace, chiptrace.cli; chiptrace.cli.build_parser()")
    assert "textual" not in mods
    assert "chiptrace.viewer.app" not in mods


def test_model_does_not_import_textual() -> None:
    assert "textual" not in _modules_after(
        "import chiptrace.viewer.live_model, chiptrace.viewer.alerts"
    )


def test_viewer_imports_textual() -> None:
    assert "textual" in _modules_after("import chiptrace.viewer.app")
