"""Running one docs block as a reader would: commands in bash, Python with python, SQL in
DuckDB over the fixture stores, TOML as a topology.

Each doc gets one working directory for the session, shared by its blocks in document order
(a page's later commands read what its earlier ones wrote, as on a reader's machine). The
directory looks like the checkout (links to samples/, tests/, benchmarks/, docs/,
README.md, pyproject.toml) plus the reader's own `train.py`, so repository paths such as
`tests/fixtures/kineto/...` work and nothing is written into the checkout.

Before a block runs, its text is filled in (`fill`): the default OTLP ports 4318/4317 become
the test's receiver, `/mnt/...` a folder of the working directory, and the placeholders
`DIR` (a copy of the emulated fixture store), `IMPORTED_DIR` (a copy of the imported Kineto
store), `FILE` (a Kineto fixture) and `<run-id>` (the emulated store's run id).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path

from mdblocks import ROOT, Block

HERE = Path(__file__).resolve().parent
BLOCK_TIMEOUT_S = 180.0  # a hung block fails instead of hanging the suite
LINKED = ("samples", "tests", "benchmarks", "docs", "README.md", "pyproject.toml")
KINETO_FILE = "tests/fixtures/kineto/simple_add.json.gz"
# A Textual app that crashes prints this and still exits 0; a user mistake never shows one.
TRACEBACK = "Traceback (most recent call last)"

PRELUDE = r"""set -eo pipefail
chiptrace() {
  case "$1" in
    demo|emulate|collect|view|export) "$DOCS_PYTHON" "$DOCS_SHIM" "$@" ;;
    *) "$DOCS_CHIPTRACE" "$@" ;;
  esac
}
_docs_python() {
  if [ "$2 $3 $4" = "-m pip install" ]; then
    shift 4; "$DOCS_PYTHON" "$DOCS_SHIM" --pip-install "$@"
  else
    command "$@"
  fi
}
python3() { _docs_python python3 "$@"; }
python() { _docs_python python "$@"; }
"""


@dataclass
class Fixtures:
    """What placeholders are filled from, made once per session."""

    store: Path  # emulated rack6 mixed run
    run_id: str
    imported: Path  # Kineto fixture imported
    otlp_http: str  # HOST:PORT of the test's OTLP receiver
    otlp_grpc: str
    scratch: Path  # where scripts and screenshots go, outside the working dirs


@dataclass
class DocSession:
    """One doc's working directory and which of its blocks have run."""

    doc: str
    workdir: Path
    results: dict[int, str | None] = field(default_factory=dict)  # line -> failure or None


def chiptrace_script() -> Path:
    """The installed `chiptrace` entry point of this interpreter's environment."""
    for candidate in (
        Path(sys.executable).with_name("chiptrace"),
        Path(sysconfig.get_path("scripts")) / "chiptrace",
    ):
        if candidate.exists():
            return candidate
    found = shutil.which("chiptrace")
    if found is None:
        raise RuntimeError("no `chiptrace` script installed: pip install -e '.[test]'")
    return Path(found)


def new_workdir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    for name in LINKED:
        if (ROOT / name).exists():
            (path / name).symlink_to(ROOT / name)
    shutil.copy(HERE / "train.py", path / "train.py")
    return path


def environment(fx: Fixtures) -> dict[str, str]:
    """A reader's shell: the venv first on PATH, no CHIPTRACE_/OTEL_ settings of ours."""
    drop = ("CHIPTRACE_", "OTEL_", "TEXTUAL_", "PYTEST_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    script = chiptrace_script()
    bins = dict.fromkeys([str(script.parent), str(Path(sys.executable).parent)])
    env["PATH"] = os.pathsep.join([*bins, env.get("PATH", "")])
    env.update(
        DOCS_PYTHON=sys.executable,
        DOCS_SHIM=str(HERE / "bounded_cli.py"),
        DOCS_CHIPTRACE=str(script),
        DOCS_OTLP_HTTP=fx.otlp_http,
        # A Textual app a Python block starts runs headless and quits after 1 s with a
        # screenshot (Textual's own switches), so `app.run()` is bounded too.
        TEXTUAL_DRIVER="textual.drivers.headless_driver:HeadlessDriver",
        TEXTUAL_SCREENSHOT="1",
        TEXTUAL_SCREENSHOT_LOCATION=str(fx.scratch),
    )
    return env


def fill(text: str, fx: Fixtures, workdir: Path) -> str:
    """The block as it runs here: ports, mount points and placeholders filled in."""
    text = re.sub(r"\b(?:127\.0\.0\.1|localhost):4318\b", fx.otlp_http, text)
    text = re.sub(r"\b(?:127\.0\.0\.1|localhost):4317\b", fx.otlp_grpc, text)
    text = re.sub(r"(?<![\w./])/mnt/", "mnt/", text)
    text = text.replace("<run-id>", fx.run_id)
    for word, source in (("IMPORTED_DIR", fx.imported), ("DIR", fx.store)):
        if re.search(rf"\b{word}\b", text):
            copy = workdir / f"fixture-{word.lower()}"
            if not copy.exists():
                shutil.copytree(source, copy)
            text = re.sub(rf"\b{word}\b", copy.name, text)
    return re.sub(r"\bFILE\b", KINETO_FILE, text)


def run_block(block: Block, session: DocSession, fx: Fixtures) -> str | None:
    """Run one block; None when it passed, else a failure message with its output."""
    text = fill(block.text, fx, session.workdir)
    if block.kind == "sql":
        return _run_sql(block, text, fx)
    if block.kind == "toml":
        return _run_toml(block, text, fx)
    if block.kind == "sh":
        cmd = ["bash", "-c", PRELUDE + text]
    else:
        script = fx.scratch / f"{block.doc.replace('/', '_')}_{block.line}.py"
        script.write_text(text)
        cmd = [sys.executable, str(script)]
    rc, output = _run(cmd, session.workdir, environment(fx))
    (fx.scratch / f"{block.doc.replace('/', '_')}_{block.line}.out").write_text(output)
    if rc == 0 and TRACEBACK not in output:
        return None
    why = "timed out" if rc is None else f"exited {rc}" if rc else "printed a traceback"
    return _failure(block, why, text, output, session.workdir)


def _run(cmd: list[str], cwd: Path, env: dict[str, str]) -> tuple[int | None, str]:
    """Run in its own process group, so a timeout ends everything the block started."""
    proc = subprocess.Popen(
        cmd,
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=BLOCK_TIMEOUT_S)
        return proc.returncode, out
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        return None, out


def _run_sql(block: Block, text: str, fx: Fixtures) -> str | None:
    import chiptrace

    con = chiptrace.connect([fx.store, fx.imported])
    try:
        con.execute(text).fetchall()
    except Exception as e:  # noqa: BLE001  (any DuckDB error is the block's failure)
        return _failure(block, "failed", text, f"{type(e).__name__}: {e}", None)
    finally:
        con.close()
    return None


def _run_toml(block: Block, text: str, fx: Fixtures) -> str | None:
    import tomllib

    from chiptrace.emulator.topology_files import load_topology

    path = fx.scratch / f"{block.doc.replace('/', '_')}_{block.line}.toml"
    path.write_text(text)
    try:
        data = tomllib.loads(text)
        if "chips" in data:  # a topology file: it must load as one
            load_topology(path)
    except Exception as e:  # noqa: BLE001
        return _failure(block, "failed", text, f"{type(e).__name__}: {e}", None)
    return None


def _failure(block: Block, why: str, text: str, output: str, cwd: Path | None) -> str:
    where = f" in {cwd}" if cwd else ""
    tail = output[-8000:]
    return (
        f"{block.where}: {block.kind} block {why}{where}\n"
        f"--- block (as run) ---\n{text.rstrip()}\n--- output ---\n{tail.rstrip()}"
    )
