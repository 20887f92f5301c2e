#!/usr/bin/env python3
"""Run mypy or import-linter on chiptrace as installed: one package, exporters/ and viewer/ inside.

pyproject maps the top-level folders exporters/ and viewer/ to chiptrace.exporters and
chiptrace.viewer (package-dir). Neither mypy nor import-linter's graph (grimp) follows that
mapping through an editable install, so both would see two stray top-level packages. This
script builds the installed layout as a tree of symlinks, build/mapped/chiptrace, and runs the
tool there, with pyproject's settings:

    python3 .ci/mapped.py mypy          # type-check the whole package
    python3 .ci/mapped.py contracts     # the layer contracts (lint-imports)
    python3 .ci/mapped.py --root DIR contracts   # the same for a copy of the checkout (tests)

Links, not copies: mypy's messages name the real files' content at build/mapped paths, and the
tree stays right when the sources change. Rebuilt on every run (cheap) so a new module or a
deleted one is seen.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# Mirrors [tool.setuptools] package-dir in pyproject.toml.
MAPPED = {"exporters": "exporters", "viewer": "viewer"}
SKIP = {"__pycache__"}


def build(root: Path) -> Path:
    """Make root/build/mapped/chiptrace mirror the installed package; return build/mapped."""
    out = root / "build" / "mapped"
    if out.exists():
        shutil.rmtree(out)
    pkg = out / "chiptrace"
    pkg.mkdir(parents=True)
    for entry in sorted((root / "chiptrace").iterdir()):
        if entry.name in SKIP or entry.name in MAPPED:
            continue
        os.symlink(entry.resolve(), pkg / entry.name)
    for name, folder in MAPPED.items():
        os.symlink((root / folder).resolve(), pkg / name)
    return out


def run(tool: str, root: Path) -> int:
    mapped = build(root)
    config = root / "pyproject.toml"
    env = dict(os.environ)
    # Both tools import nothing from the tree, but grimp resolves `chiptrace` on sys.path:
    # put the mapped tree first so it wins over the editable install.
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(mapped), env.get("PYTHONPATH")]))
    if tool == "mypy":
        # The cache sits beside the tree, which is rebuilt on every run: a warm run takes
        # seconds instead of a minute.
        cache = mapped.parent / "mypy_cache"
        cmd = [
            sys.executable,
            "-m",
            "mypy",
            "--config-file",
            str(config),
            "--cache-dir",
            str(cache),
        ]
        cmd += ["-p", "chiptrace"]
        env["MYPYPATH"] = str(mapped)
    else:
        cmd = [_lint_imports(), "--config", str(config)]
    return subprocess.run(cmd, cwd=mapped, env=env).returncode


def _lint_imports() -> str:
    exe = Path(sys.executable).parent / "lint-imports"
    return str(exe) if exe.exists() else (shutil.which("lint-imports") or "lint-imports")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("tool", choices=["mypy", "contracts"])
    parser.add_argument(
        "--root", type=Path, default=REPO, help="checkout to check (default: this one)"
    )
    args = parser.parse_args(argv)
    return run(args.tool, args.root.resolve())


if __name__ == "__main__":
    sys.exit(main())
