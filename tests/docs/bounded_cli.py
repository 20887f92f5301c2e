"""The `chiptrace` a docs block runs: the venv's real CLI, with long-running commands bounded.

tests/docs/test_docs_blocks.py runs shell blocks in bash with `chiptrace` defined as this
script, so every command a reader copies runs through the installed entry point. What this
changes, each change printed on stderr (`docs-test: ...`) so a failure shows what ran:

- `demo`: at most `--seconds 1` (it is paced to wall time, 10 s by default).
- `emulate --realtime`: at most 2 steps (paced too); `nvl72` runs at most 1 step
  (1.8 M spans a step).
- `collect`, `view --otlp`: they serve until SIGTERM. They listen on port 0 instead of the
  address given; once they print their ready line, one small OTLP/JSON request is sent (what
  an instrumented app would do, so the block's later commands find spans), then SIGTERM;
  the exit status is theirs.
- `export` without a URL after `--otlp`: `OTEL_EXPORTER_OTLP_ENDPOINT` is the test's OTLP
  receiver (`DOCS_OTLP_HTTP`), standing in for the reader's Jaeger.

`python3 -m pip install -e .[EXTRAS]` is answered here too (bash routes it with
`--pip-install`): the test venv is that install; only the extras' names are checked.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import tomllib
import urllib.request
from pathlib import Path

REAL = Path(os.environ.get("DOCS_CHIPTRACE") or Path(sys.executable).with_name("chiptrace"))
ROOT = Path(__file__).resolve().parents[2]
READY_TIMEOUT_S = 60.0  # a loaded 2-core box takes seconds to import and bind


def main(argv: list[str]) -> int:
    if argv[:1] == ["--pip-install"]:
        return _pip_install(argv[1:])
    env = dict(os.environ)
    command = argv[0] if argv else ""
    if command == "demo":
        argv = _cap(argv, "--seconds", 1.0, default=1.0)
    elif command == "emulate":
        if "--realtime" in argv:
            argv = _cap(argv, "--steps", 2, default=2)
        if _option(argv, "--topology") == "nvl72":
            argv = _cap(argv, "--steps", 1, default=1)
    elif command == "collect":
        return _serve_then_stop(_local(_local(argv, "--listen"), "--grpc"))
    elif command == "view" and "--otlp" in argv:
        return _serve_then_stop(_view_otlp_local(argv))
    elif command == "export" and _bare_otlp(argv):
        env.setdefault("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://{os.environ['DOCS_OTLP_HTTP']}")
    if argv != sys.argv[1:]:
        print(f"docs-test: ran chiptrace {' '.join(argv)}", file=sys.stderr, flush=True)
    return subprocess.run([str(REAL), *argv], env=env).returncode


def _option(argv: list[str], name: str) -> str | None:
    for i, a in enumerate(argv):
        if a == name and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith(name + "="):
            return a.split("=", 1)[1]
    return None


def _set_option(argv: list[str], name: str, value: str) -> list[str]:
    out = list(argv)
    for i, a in enumerate(out):
        if a == name and i + 1 < len(out):
            out[i + 1] = value
            return out
        if a.startswith(name + "="):
            out[i] = f"{name}={value}"
            return out
    return [*out, name, value]


def _cap(argv: list[str], name: str, most: float, default: float) -> list[str]:
    """`name` at most `most`; added as `default` when absent."""
    given = _option(argv, name)
    value = default if given is None else min(float(given), most)
    text = str(int(value)) if float(value).is_integer() else str(value)
    return argv if given == text else _set_option(argv, name, text)


def _local(argv: list[str], name: str) -> list[str]:
    given = _option(argv, name)
    if given is None or given.lower() == "none":
        return argv
    return _set_option(argv, name, "127.0.0.1:0")


def _view_otlp_local(argv: list[str]) -> list[str]:
    out = list(argv)
    i = out.index("--otlp")
    if i + 1 < len(out) and not out[i + 1].startswith("-") and ":" in out[i + 1]:
        out[i + 1] = "127.0.0.1:0"
    else:
        out.insert(i + 1, "127.0.0.1:0")
    return out


def _bare_otlp(argv: list[str]) -> bool:
    if "--otlp" not in argv:
        return False
    i = argv.index("--otlp")
    return i + 1 >= len(argv) or argv[i + 1].startswith("-")


def _serve_then_stop(argv: list[str]) -> int:
    """Start a command that serves until SIGTERM, feed it one request once ready, stop it."""
    print(f"docs-test: ran chiptrace {' '.join(argv)}, then SIGTERM", file=sys.stderr, flush=True)
    proc = subprocess.Popen([str(REAL), *argv], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    ready: list[str] = []
    reader = threading.Thread(target=lambda: ready.append(proc.stdout.readline()), daemon=True)
    reader.start()
    reader.join(READY_TIMEOUT_S)
    line = ready[0] if ready else ""
    sys.stdout.write(line)
    url = re.search(r"http://[\d.]+:\d+", line)
    if url is None:
        proc.kill()
        print(f"docs-test: no ready line with an http:// address: {line!r}", file=sys.stderr)
        return 1
    try:
        _send_one_request(url.group(0) + "/v1/traces")
    finally:
        proc.send_signal(signal.SIGTERM)
        rest, _ = proc.communicate(timeout=READY_TIMEOUT_S)
        sys.stdout.write(rest)
    return proc.returncode


def _send_one_request(url: str) -> None:
    """Two spans of a `step` on gpu:0 from host node1, as an OTel SDK sends them."""

    def attr(key: str, value: str) -> dict:
        return {"key": key, "value": {"stringValue": value}}

    t0 = 1_767_225_600_000_000_000  # 2026-01-01T00:00:00Z, as the emulator's runs
    trace = "5b8aa5a2d2c872e8321cf37308d69df2"
    spans = [
        {
            "traceId": trace,
            "spanId": "051581bf3cb55c13",
            "name": "step",
            "kind": 1,
            "startTimeUnixNano": str(t0),
            "endTimeUnixNano": str(t0 + 2_000_000),
        },
        {
            "traceId": trace,
            "spanId": "5fb397be34d26b51",
            "parentSpanId": "051581bf3cb55c13",
            "name": "forward",
            "kind": 1,
            "startTimeUnixNano": str(t0 + 100_000),
            "endTimeUnixNano": str(t0 + 1_900_000),
            "attributes": [attr("chip.id", "gpu:0"), attr("op.kind", "compute")],
        },
    ]
    body = {
        "resourceSpans": [
            {
                "resource": {
                    "attributes": [attr("service.name", "docs"), attr("host.name", "node1")]
                },
                "scopeSpans": [{"scope": {"name": "docs-test"}, "spans": spans}],
            }
        ]
    }
    request = urllib.request.Request(
        url, json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        if response.status != 200:
            raise RuntimeError(f"docs-test: {url} answered {response.status}")


def _pip_install(args: list[str]) -> int:
    """`pip install -e .` / `-e '.[test]'` of this checkout: already done, check the extras."""
    targets = [a for a in args if not a.startswith("-")]
    extras = _extras()
    for target in targets:
        m = re.fullmatch(r"\.(?:\[(?P<extras>[\w,\s-]+)\])?", target)
        if m is None:
            print(f"docs-test: pip install {target!r}: expected . or .[EXTRAS]", file=sys.stderr)
            return 1
        wanted = {e.strip() for e in (m["extras"] or "").split(",") if e.strip()}
        if wanted - extras:
            print(
                f"docs-test: no extra {sorted(wanted - extras)} in pyproject.toml", file=sys.stderr
            )
            return 1
    print("docs-test: pip install skipped: the test venv is this checkout installed editable")
    return 0


def _extras() -> set[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return set(project.get("optional-dependencies", {}))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
