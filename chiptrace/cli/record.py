"""`chiptrace record [--out DIR] -- CMD ARGS...`: run a program with tracing configured
through the environment and the host sampled meanwhile, the way `nsys profile` wraps one.

The child finds CHIPTRACE_DIR, CHIPTRACE_RUN_ID, CHIPTRACE_SERVICE and the OTEL_* names in
its environment, so `@chiptrace.trace` in it writes spans into DIR with no init() call;
this process samples CPUs, memory, NICs, disks and GPUs into the same DIR and run. The
command's exit code is chiptrace's exit code.
"""

from __future__ import annotations

import argparse
import logging
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

NAME = "record"
ORDER = 5
HELP = "run a program with tracing and host sampling on, then report"
DESCRIPTION = (
    "Run CMD with chiptrace configured through its environment (spans from @chiptrace.trace "
    "go to DIR) while this process samples the host's CPUs, memory, NICs, disks and NVIDIA "
    "GPUs into DIR/metrics; then print where the trace is and a short report (on stderr). "
    "Exits with CMD's exit code."
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--out",
        metavar="DIR",
        help="trace dir (default: $CHIPTRACE_DIR, else ./chiptrace-traces/<run-id>)",
    )
    p.add_argument(
        "--service", metavar="NAME", help="service.name of the spans (default: the program)"
    )
    p.add_argument(
        "--interval",
        type=float,
        default=None,
        metavar="S",
        help="seconds between host samples (default: $CHIPTRACE_SAMPLE_INTERVAL, else 0.1)",
    )
    p.add_argument("--no-sample", action="store_true", help="trace only; do not sample the host")
    p.add_argument("--quiet", "-q", action="store_true", help="print no report")
    p.add_argument(
        "--no-torch-profile",
        action="store_true",
        help="with torchrun: do not run each rank under chiptrace.torch.profile()",
    )
    p.add_argument(
        "cmd", nargs=argparse.REMAINDER, metavar="-- CMD ARGS", help="the program to run"
    )


def service_name(cmd: Sequence[str]) -> str:
    """`python train.py` -> train, `python -m pkg.mod` -> pkg.mod, `./bench` -> bench."""
    prog = Path(cmd[0]).name
    if prog.startswith("python") and len(cmd) > 1:
        if cmd[1] == "-m" and len(cmd) > 2:
            return cmd[2]
        if not cmd[1].startswith("-"):
            return Path(cmd[1]).stem
    return prog


def child_env(base: Mapping[str, str], out: Path, run_id: str, service: str) -> dict[str, str]:
    """The traced program's environment: tracing on, into `out`, under this run id."""
    from chiptrace import config

    env = dict(base)
    env[config.ENV_DIR] = str(out.resolve())
    env[config.ENV_RUN_ID] = run_id
    env[config.ENV_SERVICE] = service
    env.setdefault(config.ENV_OTEL_SERVICE, service)
    attrs = env.get(config.ENV_OTEL_RESOURCE, "")
    env[config.ENV_OTEL_RESOURCE] = ",".join(filter(None, [attrs, f"chiptrace.run_id={run_id}"]))
    env[config.ENV_SAMPLE_HOST] = "0"  # this process samples the host; the child must not
    return env


def _command(args: argparse.Namespace) -> list[str]:
    from chiptrace.host import HostError

    cmd = list(args.cmd)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        raise HostError(
            "record: no command given; usage: chiptrace record [--out DIR] -- CMD ARGS..."
        )
    if shutil.which(cmd[0]) is None:
        raise HostError(f"record: command not found or not executable: {cmd[0]!r}")
    return cmd


def _profiled(cmd: list[str]) -> tuple[list[str], list[str]]:
    """A torchrun command with each rank run under chiptrace.torch.profile(), so every
    rank's profiler ops join the store (chiptrace.cli._torchrun); any other, unchanged.
    Also the program the ranks run (`python SCRIPT ARGS`), which names the service."""
    from importlib.util import find_spec

    from chiptrace.cli._torchrun import RUNNER, launcher_end, wrap  # torch loads in wrap()

    if launcher_end(cmd) is None:
        return cmd, cmd
    why: str | None = "PyTorch is not installed here"
    if find_spec("torch") is not None:
        wrapped, why = wrap(cmd)
    if why is not None:
        print(f"chiptrace: torchrun ranks not profiled: {why}", file=sys.stderr)
        return cmd, cmd
    print(
        "chiptrace: each rank runs under chiptrace.torch.profile() "
        "(python -m chiptrace.torch; --no-torch-profile turns it off)",
        file=sys.stderr,
    )
    return wrapped, ["python", *wrapped[wrapped.index(RUNNER) + 1 :]]


def _wait(proc: subprocess.Popen[Any]) -> int:
    """Wait for the child; Ctrl-C reaches it too, so keep waiting for its own exit code.
    SIGTERM to us is passed on to it."""

    def forward(signum: int, frame: Any) -> None:
        proc.send_signal(signum)

    previous = None
    try:
        previous = signal.signal(signal.SIGTERM, forward)
    except ValueError:  # not the main thread (record called from a library)
        pass
    try:
        while True:
            try:
                # A timeout, so the main thread runs our SIGTERM handler even when the
                # kernel delivers the signal to another thread (the host sampler's).
                rc = proc.wait(timeout=0.2)
                break
            except subprocess.TimeoutExpired:
                continue
            except KeyboardInterrupt:
                continue
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    return rc if rc >= 0 else 128 - rc  # killed by signal N: the shell's 128 + N


def run(args: argparse.Namespace) -> int:
    from chiptrace import config
    from chiptrace.errors import ConfigError
    from chiptrace.host import HostError
    from chiptrace.host.sampler import HostSampler

    cmd = _command(args)
    program = cmd  # what names the service: the training script, not torchrun
    if not args.no_torch_profile:
        cmd, program = _profiled(cmd)
    if args.interval is not None and not args.interval >= config.MIN_SAMPLE_INTERVAL_S:
        raise ConfigError(f"--interval {args.interval:g}: expected at least 0.01 seconds")
    _, interval = config.resolve_sampling(True, args.interval)  # --interval, then the env
    run_id = os.environ.get(config.ENV_RUN_ID) or config.new_run_id()
    out = Path(args.out or os.environ.get(config.ENV_DIR) or Path(config.DEFAULT_ROOT) / run_id)
    service = args.service or os.environ.get(config.ENV_SERVICE) or service_name(program)
    sampler = None
    if not args.no_sample:
        sampler = HostSampler(
            out, interval=interval, run_id=run_id, service=service, manifest={"command": cmd}
        ).start()
    t0_ns, t0 = time.time_ns(), time.monotonic()
    try:
        proc = subprocess.Popen(cmd, env=child_env(os.environ, out, run_id, service))
    except OSError as e:
        if sampler is not None:
            sampler.stop()
        raise HostError(f"record: cannot run {cmd[0]!r}: {e.strerror or e}") from e
    if sampler is not None:
        sampler.watch_process(proc.pid)
    try:
        rc = _wait(proc)
    finally:
        if sampler is not None:
            sampler.stop()
    if not args.quiet:
        _report(out, cmd, rc, time.monotonic() - t0, t0_ns, sampler)
    return rc


def _report(out: Path, cmd: list[str], rc: int, seconds: float, t0_ns: int, sampler: Any) -> None:
    from chiptrace.errors import ChiptraceError
    from chiptrace.host.summary import summarize
    from chiptrace.query import connect

    shown = " ".join(shlex.join(cmd).split())  # one line, even for `python -c "..."`
    shown = shown if len(shown) <= 60 else shown[:59] + "…"
    print(f"chiptrace: recorded `{shown}` (exit {rc}) into {out}", file=sys.stderr)
    try:
        con = connect(out, allow_empty=True)
        summary = summarize(con, since_ns=t0_ns)
    except (ChiptraceError, OSError) as e:
        print(f"chiptrace: no report: {e}", file=sys.stderr)
        return
    lines = render(summary, seconds, sampler)
    if summary.spans:
        lines += _findings(con, t0_ns)
    for line in lines:
        print(f"  {line}", file=sys.stderr)
    print(f'next: chiptrace query {out} "SELECT * FROM metrics LIMIT 20"', file=sys.stderr)


def _findings(con: Any, since_ns: int, top: int = 3) -> list[str]:
    """The analysis' top findings, where chiptrace.analysis is there and has something to say.
    Optional: the record report stands without it, so any failure here is left out."""
    try:
        from chiptrace.analysis import TraceAnalysis

        found = TraceAnalysis(con, since_ns=since_ns).findings()
    except Exception as e:  # noqa: BLE001 - an analysis problem must not hide the recording
        logging.getLogger("chiptrace").debug("chiptrace: record: no findings: %s", e)
        return []
    return [
        f"finding       {f.severity} {f.rule} on {f.culprit}: {f.suggestion}" for f in found[:top]
    ]


def render(summary: Any, seconds: float, sampler: Any = None) -> list[str]:
    """The report's lines for a `chiptrace.host.summary.RunSummary`."""
    lines = [f"duration      {seconds:.2f} s"]
    by_type = ", ".join(f"{t} {n}" for t, n in summary.spans_by_chip_type.items())
    lines.append(f"spans         {summary.spans}" + (f" ({by_type})" if by_type else ""))
    if summary.cpu_util is not None:
        lines.append(f"cpu           {summary.cpu_util:.1f}% mean over {summary.cpus} logical CPUs")
    if summary.program is not None:
        mean, peak, cpu_s, rss = summary.program
        lines.append(
            f"program       {mean:.2f} cores mean, {peak:.2f} peak, {cpu_s:.2f} CPU s, "
            f"{_bytes(rss)} peak RSS"
        )
    if summary.top_nic is not None:
        name, chip, rx, tx = summary.top_nic
        if rx or tx:
            lines.append(f"top nic       {name} ({chip}): {_bytes(rx)} in, {_bytes(tx)} out")
        else:
            lines.append("top nic       none: no interface moved a byte")
    for g in summary.gpus:
        util = f"{g.util:.1f}%" if g.util is not None else "n/a"
        mem = _bytes(g.mem_used_max) if g.mem_used_max is not None else "n/a"
        power = f", {g.power:.0f} W" if g.power is not None else ""
        lines.append(f"{g.chip_id:<13} {g.name}: {util} util, {mem} peak memory{power}")
    if sampler is not None:
        lines.append(
            f"host samples  {summary.samples} rows at {1 / sampler.interval:g} Hz; {sampler.nvml_status}"
        )
    return lines


def _bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} GB"
