"""Layers point one way, and the checks that say so can fail.

The layer contracts live in pyproject.toml ([tool.importlinter], docs/architecture.md) and
run through .ci/mapped.py, which lets import-linter see exporters/ and viewer/ as
chiptrace.exporters and chiptrace.viewer. These tests run them, check that every module
sits in a layer, and that a forbidden import copied into a module makes them fail.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
MAPPED = REPO / ".ci" / "mapped.py"
# Mirrors [tool.setuptools] package-dir: folder -> the chiptrace subpackage it installs as.
FOLDERS = {"chiptrace": None, "exporters": "exporters", "viewer": "viewer"}


def _contracts(root: Path) -> subprocess.CompletedProcess[str]:
    pytest.importorskip("importlinter", reason="pip install -e '.[test]' brings import-linter")
    return subprocess.run(
        [sys.executable, str(MAPPED), "--root", str(root), "contracts"],
        capture_output=True,
        text=True,
        timeout=120,
    )


def _layers_contract() -> dict:
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]
    (layers,) = [c for c in config["contracts"] if c["type"] == "layers"]
    return layers


def test_import_chiptrace_stays_light():
    """At run time too: lazy imports inside functions are invisible to the contracts' test
    of what `import chiptrace` loads, so load it and look."""
    code = (
        "import sys, chiptrace\n"
        "heavy = [m for m in ('textual', 'chiptrace.viewer', 'chiptrace.exporters', "
        "'chiptrace.analysis', 'chiptrace.host', 'duckdb') if m in sys.modules]\n"
        "print(','.join(heavy))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_the_core_gets_the_exporter_and_sampler_injected():
    """lifecycle imports neither; `import chiptrace` hands it their factories."""
    import chiptrace  # noqa: F401 - fills the registry
    from chiptrace import lifecycle

    assert lifecycle.EXTENSIONS.otlp_sink is not None
    assert lifecycle.EXTENSIONS.host_sampler is not None


@pytest.mark.parametrize("registered", [True, False])
def test_init_streams_otlp_through_the_registered_sink(tmp_path, monkeypatch, registered):
    """chiptrace's own encoder when registered (always, by `import chiptrace`); else the
    OpenTelemetry SDK's exporter."""
    import chiptrace
    from chiptrace import lifecycle
    from chiptrace.exporters.otlp import OtlpSink
    from chiptrace.recording.otel_sinks import ExporterSink

    if not registered:
        monkeypatch.setattr(lifecycle.EXTENSIONS, "otlp_sink", None)
    rec = chiptrace.init(tmp_path, otlp_endpoint="http://127.0.0.1:9")  # nothing is sent
    try:
        assert rec is not None
        kinds = {type(getattr(s, "sink", s)) for s in rec.sinks}
        assert (OtlpSink if registered else ExporterSink) in kinds
    finally:
        chiptrace.shutdown()


def test_the_contracts_hold():
    result = _contracts(REPO)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "broken" in result.stdout and "0 broken" in result.stdout


def test_every_module_sits_in_a_layer():
    """Every module of the installed package, exporters/ and viewer/ included, falls under
    one name of the layers contract (and the contract is exhaustive, so import-linter
    also fails on a child of chiptrace that no layer names)."""
    layers = _layers_contract()
    assert layers["containers"] == ["chiptrace"] and layers["exhaustive"] is True
    names = {
        name.strip().strip("()")
        for layer in layers["layers"]
        for name in layer.replace(":", "|").split("|")
    }
    missing = []
    for folder, mapped in FOLDERS.items():
        for path in sorted((REPO / folder).rglob("*.py")):
            rel = path.relative_to(REPO / folder)
            if mapped is not None:
                child = mapped
            elif rel.parts == ("__init__.py",):
                continue  # the package itself: the facade every layer sits in
            else:
                child = rel.parts[0].removesuffix(".py")
            if child not in names:
                missing.append(str(path.relative_to(REPO)))
    assert not missing, f"modules in no layer of pyproject's layers contract: {missing}"


def _copy_checkout(tmp_path: Path) -> Path:
    root = tmp_path / "checkout"
    skip = shutil.ignore_patterns("__pycache__", "*.pyc")
    for folder in (*FOLDERS, ".ci"):
        shutil.copytree(REPO / folder, root / folder, ignore=skip)
    shutil.copy(REPO / "pyproject.toml", root / "pyproject.toml")
    return root


@pytest.mark.parametrize(
    ("module", "line", "broken"),
    [
        # The store below the exporters (a layer violation).
        ("chiptrace/store.py", "import chiptrace.exporters.chrome", "Layers"),
        # A mapped folder: the viewer below the CLI, seen through the link tree.
        ("viewer/live_model.py", "import chiptrace.cli", "Layers"),
        # Textual outside the viewer and the CLI.
        ("chiptrace/analysis/report.py", "import textual", "Textual only"),
        # `import chiptrace` would load the analysis.
        ("chiptrace/api.py", "import chiptrace.analysis", "stays light"),
        # A cycle between siblings of one layer.
        (
            "chiptrace/emulator/topology_files.py",
            "import chiptrace.emulator.run",
            "No import cycles",
        ),
        # A new module that no layer names.
        ("chiptrace/unlayered.py", "import chiptrace.errors", "not listed as layers"),
    ],
)
def test_a_forbidden_import_breaks_the_contracts(tmp_path, module, line, broken):
    root = _copy_checkout(tmp_path)
    target = root / module
    before = target.read_text() if target.exists() else ""
    target.write_text(before + f"\n{line}  # injected by the test\n")
    result = _contracts(root)
    assert result.returncode != 0, result.stdout
    report = result.stdout.split("Broken contracts")[-1]
    assert broken in report, result.stdout
