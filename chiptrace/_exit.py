"""Process exit: run the recorders' flush hooks at interpreter exit and on SIGTERM.

The SIGTERM handler only writes a byte to a pipe: Python runs handlers on the main thread
between bytecodes, so a handler that flushed would wait for a lock the interrupted main
thread may hold (its own flush()) and never return. A watcher thread reads the pipe, runs
the exit hooks on an ordinary thread, then ends the process as SIGTERM would have.
"""

from __future__ import annotations

import atexit
import logging
import os
import signal
import threading
from collections.abc import Callable
from typing import Any

log = logging.getLogger("chiptrace")

_exit_hooks: list[Callable[[], None]] = []
_installed = False
_signal_pipe: tuple[int, int] | None = None


def on_exit(hook: Callable[[], None]) -> None:
    """Run `hook` at interpreter exit and on SIGTERM (when nobody else handles SIGTERM)."""
    global _installed
    _exit_hooks.append(hook)
    if _installed:
        return
    _installed = True
    atexit.register(_run_exit_hooks)
    if threading.current_thread() is threading.main_thread():
        try:
            if signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):
                _start_watcher()
                signal.signal(signal.SIGTERM, _on_sigterm)
        except (ValueError, OSError):
            pass


def cancel_exit(hook: Callable[[], None]) -> None:
    """Forget a hook registered with `on_exit` (a replaced recorder): nothing keeps it alive."""
    try:
        _exit_hooks.remove(hook)
    except ValueError:
        pass


def _run_exit_hooks() -> None:
    while True:
        try:
            hook = _exit_hooks.pop()
        except IndexError:
            return
        try:
            hook()
        except Exception:  # noqa: BLE001
            log.exception("chiptrace: exit hook failed")


def _start_watcher() -> None:
    global _signal_pipe
    r, w = os.pipe()
    os.set_blocking(w, False)
    _signal_pipe = (r, w)
    threading.Thread(target=_watch, args=(r,), name="chiptrace-sigterm", daemon=True).start()


def _watch(fd: int) -> None:
    try:
        if not os.read(fd, 1):
            return
    except OSError:
        return
    _run_exit_hooks()
    # _on_sigterm reset the disposition to the default (signal.signal() works only on the
    # main thread), so this ends the process with the status SIGTERM gives.
    os.kill(os.getpid(), signal.SIGTERM)


def _on_sigterm(signum: int, frame: Any) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a second SIGTERM ends the process at once
    if _signal_pipe is None:
        os.kill(os.getpid(), signal.SIGTERM)
        return
    try:
        os.write(_signal_pipe[1], b"T")
    except OSError:  # the pipe is full: a wake-up is already pending
        pass


def _after_fork_in_child() -> None:
    """The watcher thread does not survive fork: a child gets its own pipe and thread."""
    global _signal_pipe
    if _signal_pipe is not None:
        for fd in _signal_pipe:
            try:
                os.close(fd)
            except OSError:
                pass
        _start_watcher()


os.register_at_fork(after_in_child=_after_fork_in_child)
