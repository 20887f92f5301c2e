"""`chiptrace record -- CMD`: a real child process, its spans and the host's metrics."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import chiptrace
from chiptrace.cli.record import child_env, render, service_name
from chiptrace.host.summary import RunSummary

CHILD = """
import socket, time, chiptrace

@chiptrace.trace(chip="gpu:0", op="compute")
def step(i):
    time.sleep(0.01)

@chiptrace.trace(chip="nic:0", op="comm")
def send():
    a, b = socket.socketpair()
    a.sendall(b"x" * 1000); b.recv(1000)

for i in range(12):
    step(i)
send()
print("child done")
raise SystemExit(3)
"""


def _record(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CHIPTRACE_", "OTEL_"))}
    return subprocess.run(
        [sys.executable, "-m", "chiptrace", "record", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
        env=env,
    )


def test_record_runs_the_program_and_stores_spans_and_metrics(tmp_path: Path) -> None:
    out = tmp_path / "trace"
    r = _record(
        "--out", str(out), "--interval", "0.05", "--", sys.executable, "-c", CHILD, cwd=tmp_path
    )
    assert r.returncode == 3, r.stderr  # the child's exit code
    assert "child done" in r.stdout
    assert str(out) in r.stderr
    assert "spans         13 (gpu 12, nic 1)" in r.stderr
    assert "% mean over" in r.stderr and "top nic" in r.stderr and "program " in r.stderr
    con = chiptrace.connect(out)
    spans = dict(con.execute("SELECT chip_type, count(*) FROM spans GROUP BY 1").fetchall())
    assert spans == {"gpu": 12, "nic": 1}
    assert con.execute("SELECT count(*) FROM metrics WHERE metric = 'cpu.util'").fetchone()[0] > 0
    runs = con.execute("SELECT source, run_id, service FROM runs ORDER BY source").fetchall()
    assert [s for s, _, _ in runs] == ["code", "real"]
    assert runs[0][1] == runs[1][1]  # one run id for the spans and the samples
    assert runs[0][2] == Path(sys.executable).name  # `python -c`: the service is the program
    proc = con.execute("SELECT DISTINCT device FROM metrics WHERE metric = 'proc.rss'").fetchall()
    assert len(proc) == 1 and proc[0][0].startswith("pid:")  # the recorded program
    manifest = con.execute("SELECT manifest FROM runs WHERE source = 'real'").fetchone()[0]
    assert '"command"' in manifest


def test_record_bad_command_is_one_line(tmp_path: Path) -> None:
    r = _record("--out", str(tmp_path / "t"), "--", "no-such-program-xyz", cwd=tmp_path)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        "chiptrace: error: record: command not found or not executable: 'no-such-program-xyz'"
    ]
    assert not (tmp_path / "t").exists()
    r = _record(cwd=tmp_path)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1
    assert "no command given" in r.stderr
    r = _record("--interval", "0", "--", "true", cwd=tmp_path)
    assert r.returncode == 2
    assert r.stderr == "chiptrace: error: --interval 0: expected at least 0.01 seconds\n"


def test_service_name_from_the_command() -> None:
    assert service_name(["python3", "train.py", "--lr", "1"]) == "train"
    assert service_name(["python", "-m", "pkg.serve"]) == "pkg.serve"
    assert service_name(["/usr/bin/python3.11", "-c", "pass"]) == "python3.11"
    assert service_name(["./bench"]) == "bench"


def test_child_env_configures_tracing_and_leaves_sampling_to_the_recorder(tmp_path: Path) -> None:
    env = child_env({"OTEL_RESOURCE_ATTRIBUTES": "team=infra"}, tmp_path / "t", "run-1", "svc")
    assert env["CHIPTRACE_DIR"] == str((tmp_path / "t").resolve())
    assert env["CHIPTRACE_RUN_ID"] == "run-1" and env["CHIPTRACE_SERVICE"] == "svc"
    assert env["OTEL_SERVICE_NAME"] == "svc"
    assert env["OTEL_RESOURCE_ATTRIBUTES"] == "team=infra,chiptrace.run_id=run-1"
    assert env["CHIPTRACE_SAMPLE_HOST"] == "0"


def test_render_lines() -> None:
    s = RunSummary({"gpu": 3, "-": 1}, cpu_util=42.04, cpus=2, top_nic=("lo", "nic:1", 2e6, 2e6))
    lines = render(s, 1.5)
    assert lines[0] == "duration      1.50 s"
    assert lines[1] == "spans         4 (gpu 3, - 1)"
    assert lines[2] == "cpu           42.0% mean over 2 logical CPUs"
    assert lines[3] == "top nic       lo (nic:1): 2.0 MB in, 2.0 MB out"


def test_record_exit_code_of_a_signalled_child_and_no_sample(tmp_path: Path) -> None:
    out = tmp_path / "t"
    kill = "import os, signal; os.kill(os.getpid(), signal.SIGTERM)"
    r = _record(
        "--out", str(out), "--no-sample", "-q", "--", sys.executable, "-c", kill, cwd=tmp_path
    )
    assert r.returncode == 128 + 15, r.stderr  # as a shell reports it
    assert r.stderr == ""  # --quiet, and no sampler to warn about NVML
    assert not (out / "metrics").exists()
