"""Signals keep their meaning with chiptrace: real child processes, real signals.

SIGTERM ends a traced process as it ends an untraced one (killed by SIGTERM: -15 here,
143 in a shell), with its buffer written; SIGINT is still KeyboardInterrupt; a handler the
program installed, before or after init(), still runs, and one that calls shutdown()
during a flush neither deadlocks nor loses the spans.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import chiptrace
from chiptrace.store import part_files, read_manifests
from tests.waiting import wait_until

_CHILD = textwrap.dedent(
    """
    import signal, sys, time, chiptrace

    out, mode = sys.argv[1], sys.argv[2]
    if mode == "thread-first":  # a first recorder made off the main thread: no SIGTERM
        import threading
        t = threading.Thread(target=chiptrace.init, args=(out + "-thread",))
        t.start()
        t.join()
    if mode == "own-before":
        def mine(signum, frame):
            chiptrace.shutdown()  # during the main thread's flush(), more often than not
            print("mine", flush=True)
            sys.exit(3)
        signal.signal(signal.SIGTERM, mine)
    chiptrace.init(out, flush_interval_s=3600)
    if mode == "own-after":
        def mine(signum, frame):
            print("mine", flush=True)
            sys.exit(4)
        signal.signal(signal.SIGTERM, mine)
    for _ in range(1000):
        with chiptrace.span("work", chip="cpu:0"):
            pass
    if mode in ("own-before", "flushing"):
        print("ready", flush=True)
        while True:
            for _ in range(50):
                with chiptrace.span("work", chip="cpu:0"):
                    pass
            chiptrace.flush()
    print("ready", flush=True)
    if mode == "gil":
        # One C call that holds the GIL throughout (no Python runs until it returns).
        sum(range(int(sys.argv[3])))
        print("returned", flush=True)
        time.sleep(30)
    else:
        time.sleep(60)
    print("fell through", flush=True)
    """
)


def _as_a_shell_starts_it() -> None:
    # A child inherits an ignored or blocked signal (Python then installs no
    # KeyboardInterrupt); the test runner's state after other tests is not a program's.
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})


def _start(out: Path, mode: str, *extra: str) -> subprocess.Popen[str]:
    cmd = [sys.executable, "-c", _CHILD, str(out), mode, *extra]
    p = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=_as_a_shell_starts_it,  # noqa: PLW1509 (no threads start before exec)
    )
    assert p.stdout is not None and p.stdout.readline().strip() == "ready"
    return p


def _end(p: subprocess.Popen[str], timeout_s: float = 30) -> tuple[str, str]:
    try:
        out, err = p.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        p.kill()
        pytest.fail("the process did not end after the signal")
    return out, err


def _stored(out: Path) -> int:
    con = chiptrace.connect(out)
    n = con.sql("SELECT count(*) FROM spans").fetchall()[0][0]
    (m,) = read_manifests([out])
    assert m["spans_written"] == n
    return int(n)


def test_sigterm_while_waiting_ends_as_sigterm_with_the_buffer_written(tmp_path: Path) -> None:
    p = _start(tmp_path / "t", "sleep")
    p.send_signal(signal.SIGTERM)
    out, err = _end(p)
    assert p.returncode == -signal.SIGTERM, err
    assert "fell through" not in out
    assert _stored(tmp_path / "t") == 1000


def test_sigterm_during_a_gil_holding_call_ends_when_it_returns(tmp_path: Path) -> None:
    p = _start(tmp_path / "t", "gil", str(30_000_000))
    p.send_signal(signal.SIGTERM)
    out, err = _end(p)
    assert p.returncode == -signal.SIGTERM, err
    assert "returned" not in out  # the program did not run on after the call
    assert _stored(tmp_path / "t") == 1000


def test_an_init_on_the_main_thread_after_one_on_another_takes_sigterm(tmp_path: Path) -> None:
    p = _start(tmp_path / "t", "thread-first")
    p.send_signal(signal.SIGTERM)
    out, err = _end(p)
    assert p.returncode == -signal.SIGTERM, err
    assert _stored(tmp_path / "t") == 1000  # written on the signal, not lost with the process


def test_sigint_is_still_keyboard_interrupt(tmp_path: Path) -> None:
    p = _start(tmp_path / "t", "sleep")
    p.send_signal(signal.SIGINT)
    out, err = _end(p)
    assert "KeyboardInterrupt" in err
    assert p.returncode == -signal.SIGINT  # as untraced Python leaves on KeyboardInterrupt
    assert _stored(tmp_path / "t") == 1000  # written at exit


def test_a_handler_installed_after_init_runs(tmp_path: Path) -> None:
    p = _start(tmp_path / "t", "own-after")
    p.send_signal(signal.SIGTERM)
    out, err = _end(p)
    assert "mine" in out and p.returncode == 4, err
    assert _stored(tmp_path / "t") == 1000


def test_a_handler_that_calls_shutdown_during_flush_neither_hangs_nor_loses(
    tmp_path: Path,
) -> None:
    procs = [(_start(tmp_path / f"t{i}", "own-before"), tmp_path / f"t{i}") for i in range(2)]
    for p, out in procs:
        wait_until(lambda out=out: len(part_files(out)) >= 2, "two parts")
        p.send_signal(signal.SIGTERM)
    for p, out in procs:
        _, err = _end(p)
        assert p.returncode == 3, err
        (m,) = read_manifests([out])
        # sys.exit() in the handler raises into the flush it interrupted: that flush's
        # spans (the 1,000 or 50 it had taken) are lost, and counted; the rest are stored.
        assert m.get("ended_unix_ns") and m["spans_dropped"] <= 1000
        assert _stored(out) + m["spans_dropped"] >= 1000


@pytest.mark.timing
@pytest.mark.parametrize("mode", ["sleep", "flushing"])
def test_sigterm_ends_a_waiting_or_flushing_process_within_2_s(tmp_path: Path, mode: str) -> None:
    p = _start(tmp_path / "t", mode)
    if mode == "flushing":
        wait_until(lambda: len(part_files(tmp_path / "t")) >= 2, "two parts")
    t0 = time.monotonic()
    p.send_signal(signal.SIGTERM)
    _end(p)
    took = time.monotonic() - t0
    assert p.returncode == -signal.SIGTERM and took < 2.0, took
    assert _stored(tmp_path / "t") >= 1000


_INTERRUPTED = textwrap.dedent(
    """
    import os, signal, sys, threading, time, chiptrace

    out, how = sys.argv[1], sys.argv[2]
    rec = chiptrace.init(out, flush_interval_s=3600, flush_spans=10**9)
    if how == "own-handler":
        def mine(signum, frame):
            chiptrace.shutdown()  # during the main thread's flush
            sys.exit(4)
        signal.signal(signal.SIGTERM, mine)
    for _ in range(200_000):
        with chiptrace.span("work", chip="cpu:0"):
            pass

    def interrupt() -> None:  # once the flush has taken the spans, mid-conversion
        while not rec._in_flight:
            time.sleep(0.0005)
        os.kill(os.getpid(), signal.SIGINT if how == "sigint" else signal.SIGTERM)

    threading.Thread(target=interrupt, daemon=True).start()
    chiptrace.flush()
    print("flush returned", flush=True)
    """
)


@pytest.mark.parametrize("how", ["sigint", "own-handler"])
def test_a_flush_the_programs_handler_raises_into_counts_what_it_held(
    tmp_path: Path, how: str
) -> None:
    # KeyboardInterrupt, or the program's own handler leaving with sys.exit(), raised
    # into the main thread's flush: the spans that flush had taken are counted as
    # dropped in the manifest (they were lost without a trace before).
    out = tmp_path / "t"
    p = subprocess.run(
        [sys.executable, "-c", _INTERRUPTED, str(out), how],
        capture_output=True,
        text=True,
        timeout=60,
        preexec_fn=_as_a_shell_starts_it,  # noqa: PLW1509 (no threads start before exec)
    )
    assert p.returncode == (-signal.SIGINT if how == "sigint" else 4), p.stderr
    assert "flush returned" not in p.stdout
    (m,) = read_manifests([out])
    assert m.get("ended_unix_ns")
    assert m["spans_written"] + m.get("spans_dropped", 0) == 200_000
    assert m.get("spans_dropped", 0) > 0  # the signal landed inside the flush
