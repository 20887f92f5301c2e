"""`chiptrace view DIR` on a pseudo-terminal, timed as a user sees it.

The real CLI runs in a fresh process whose stdin and stdout are a pty of a fixed size (as in
a terminal window); we read what it draws and note, from the command's start:

- the first frame with data: a chip panel titled with its chip count and load ("GPU ×72
  avg 66%"), drawn from spans read (a store is read newest part first, so this may be a
  window cut short, which the status line says: "window 14 ms of 359 ms");
- the first frame with the whole window ("window 359.2 ms  ", not "… of …");

with the process's peak RSS at each (VmHWM), then press q and time the exit.
"""

from __future__ import annotations

import fcntl
import os
import re
import select
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

ROWS, COLS = 45, 160
_ESCAPE = re.compile(
    rb"\x1b(?:\[[0-9;?<=>]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)|[()][A-Z0-9]|[=>78MDEc])"
)
_DATA = re.compile(r"(GPU|CPU|DPU|NPU|NIC|SWITCH) ×\d+ +avg +\d+%")
# The status line of a frame whose window is whole, with spans in it ("0 seen": waiting).
_WHOLE = re.compile(r"window [\d.]+ [mµn]?s  \S+ spans/s  (?!0 seen)\S+ (seen|of)")


def _peak_rss_gib(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 2**20
    except OSError:
        pass
    return float("nan")


def first_frame(directory: Path, timeout_s: float = 120.0) -> dict:
    """Seconds and peak RSS (GiB) at the first frame with data and with the whole window,
    the seconds `q` took to end it, and the lines of the last frame read."""
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", ROWS, COLS, 0, 0))
    env = {**os.environ, "TERM": "xterm-256color", "COLUMNS": str(COLS), "LINES": str(ROWS)}
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-m", "chiptrace", "view", str(directory)],
        stdin=slave,
        stdout=slave,
        stderr=slave,
        env=env,
        start_new_session=True,
    )
    os.close(slave)
    out: dict = {}
    tail = ""
    try:
        while "whole_s" not in out and time.perf_counter() - t0 < timeout_s:
            ready, _, _ = select.select([master], [], [], 0.5)
            if not ready:
                if proc.poll() is not None:
                    raise RuntimeError(f"chiptrace view exited with {proc.returncode}: {tail}")
                continue
            try:
                chunk = os.read(master, 1 << 16)
            except OSError:  # the child closed the terminal
                raise RuntimeError(f"chiptrace view ended early: {tail[-400:]}") from None
            now = time.perf_counter() - t0
            # A frame's text, escapes stripped; the last 4 KB kept for a match cut in two.
            tail = (tail + _ESCAPE.sub(b"", chunk).decode("utf-8", "replace"))[-4096:]
            if "data_s" not in out and (m := _DATA.search(tail)):
                out.update(data_s=now, data_gib=_peak_rss_gib(proc.pid), data_text=m.group(0))
            if "data_s" in out and (m := _WHOLE.search(tail)):
                out.update(whole_s=now, whole_gib=_peak_rss_gib(proc.pid))
        t_quit = time.perf_counter()
        os.write(master, b"q")
        while proc.poll() is None and time.perf_counter() - t_quit < 60:
            if select.select([master], [], [], 0.1)[0]:
                try:
                    os.read(master, 1 << 16)
                except OSError:
                    break
        proc.wait(timeout=60)
        out["quit_s"] = time.perf_counter() - t_quit
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(master)
    return out
