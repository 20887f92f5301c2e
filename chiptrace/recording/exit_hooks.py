"""Process exit: the recorders' last flush at interpreter exit and on SIGTERM, with
deadlines, never changing how the process ends.

The trade-off (docs/architecture.md, "Signals"): chiptrace takes SIGTERM only where the
program left it at its default (it never replaces a handler the program installed, before
or after init()) and leaves SIGINT alone (KeyboardInterrupt unwinds and atexit flushes).
On SIGTERM it spends at most EXIT_ON_SIGNAL_S writing its buffer, then ends the process
with the signal's own default action, so the parent still sees "killed by SIGTERM" (143).
What it could not write in time is counted as dropped in the manifest.

How, without ever flushing inside a signal handler (the handler runs on the main thread
between bytecodes; if that thread was inside flush() it holds the lock the flush needs):
- `signal.set_wakeup_fd` makes CPython's C-level handler write the signal number to a
  pipe the moment the signal arrives, whatever the main thread is doing. A watcher thread
  blocked on that pipe wakes, runs the exit hooks (the recorders' shutdown, bounded), and
  ends the process. So a main thread that waits or runs GIL-releasing code (sleep, I/O,
  most torch ops) ends within 2 s.
- A main thread in a C call that holds the GIL runs no Python at all (nor can any other
  thread); when the call returns, the Python-level handler runs first: it waits for the
  watcher (which can run now) and ends the process, so the program never runs on.
- A handler that finds its own thread inside a flush returns, and that flush ends the
  process when it completes (`after_flush`), instead of deadlocking on its lock.
"""

from __future__ import annotations

import atexit
import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

log = logging.getLogger("chiptrace")

Hook = Callable[..., Any]
_exit_hooks: list[tuple[Hook, bool]] = []  # (hook, takes a timeout_s keyword)
_installed = False  # the atexit hook
_signal_tried = False  # SIGTERM looked at (on the main thread)
_pipe: tuple[int, int] | None = None  # the watcher's pipe (also the wakeup fd when ours)
_requested = False  # a SIGTERM of ours was seen: the process is ending
_hooks_done = threading.Event()
_flushing: set[int] = set()  # threads inside Recorder.flush (see after_flush)
# On SIGTERM: the last flush gets this long, the manifest note of what it could not write
# up to 0.3 s more (Recorder._give_up): the process ends within 2 s of the signal.
EXIT_ON_SIGNAL_S = 1.3
_GRACE_S = 0.5


def on_exit(hook: Hook, *, takes_timeout: bool = False) -> None:
    """Run `hook` at interpreter exit and on SIGTERM (when nobody else handles SIGTERM);
    with `takes_timeout`, it is called with `timeout_s=` the time left."""
    global _installed, _signal_tried
    _exit_hooks.append((hook, takes_timeout))
    if not _installed:
        _installed = True
        atexit.register(_run_exit_hooks)
    # Only the main thread may set a signal handler: a first recorder made on another
    # thread leaves SIGTERM alone, and the next one made on the main thread takes it.
    if not _signal_tried and threading.current_thread() is threading.main_thread():
        _signal_tried = True
        try:
            if signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):
                _start_watcher()
                signal.signal(signal.SIGTERM, _on_sigterm)
                _claim_wakeup_fd()
        except (ValueError, OSError):
            pass


def cancel_exit(hook: Hook) -> None:
    """Forget a hook registered with `on_exit` (a replaced recorder): nothing keeps it alive."""
    for i, (h, _) in enumerate(_exit_hooks):
        if h == hook:
            del _exit_hooks[i]
            return


def _run_exit_hooks(timeout_s: float | None = None) -> None:
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while True:
        try:
            hook, takes_timeout = _exit_hooks.pop()
        except IndexError:
            return
        try:
            if takes_timeout and deadline is not None:
                hook(timeout_s=max(deadline - time.monotonic(), 0.0))
            else:
                hook()
        except Exception:  # noqa: BLE001
            log.exception("chiptrace: exit hook failed")


def terminating() -> bool:
    """True once a SIGTERM of ours was seen (flush() then leaves the writing to exit)."""
    return _requested


def _start_watcher() -> None:
    global _pipe
    r, w = os.pipe()
    os.set_blocking(w, False)
    _pipe = (r, w)
    threading.Thread(target=_watch, args=(r,), name="chiptrace-sigterm", daemon=True).start()


def _claim_wakeup_fd(inherited: int = -1) -> None:
    """Have CPython's C handler write to our pipe at once; never take the fd from someone
    else (asyncio sets its own: then the Python-level handler wakes the watcher)."""
    if _pipe is None:
        return
    old = signal.set_wakeup_fd(_pipe[1], warn_on_full_buffer=False)
    if old not in (-1, inherited):
        signal.set_wakeup_fd(old)


def _ours() -> bool:
    try:
        return signal.getsignal(signal.SIGTERM) is _on_sigterm
    except (ValueError, OSError):
        return False


def _watch(fd: int) -> None:
    term = signal.SIGTERM.to_bytes(1, "little")
    while True:
        try:
            data = os.read(fd, 512)
        except OSError:
            return
        if not data:
            return
        # The wakeup fd carries every signal Python handles; a SIGTERM counts only while
        # the handler is still ours (a program may have installed its own since).
        if term in data and (_requested or _ours()):
            break
    _end(from_watcher=True)


def _end(from_watcher: bool) -> None:
    global _requested
    _requested = True
    if from_watcher:
        try:
            _run_exit_hooks(EXIT_ON_SIGNAL_S)
        finally:
            _hooks_done.set()
    else:
        _hooks_done.wait(EXIT_ON_SIGNAL_S + _GRACE_S)
    _die(signal.SIGTERM)


def _on_sigterm(signum: int, frame: Any) -> None:
    global _requested
    _requested = True
    if _pipe is not None:
        try:
            os.write(_pipe[1], signal.SIGTERM.to_bytes(1, "little"))  # wake the watcher
        except OSError:  # the pipe is full: a wake-up is pending already
            pass
    else:
        _die(signal.SIGTERM)
    if threading.get_ident() in _flushing:
        return  # this thread's flush holds the lock the exit needs: it ends us when done
    _end(from_watcher=False)


def after_flush() -> None:
    """Called by Recorder.flush as it returns: a SIGTERM that arrived during this thread's
    flush ends the process now that the lock is free (see _on_sigterm)."""
    if _requested and threading.current_thread() is threading.main_thread():
        _end(from_watcher=False)


def _die(signum: int) -> None:
    """End the process with the default action of `signum` (for SIGTERM: killed, 143)."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signum, signal.SIG_DFL)
    else:  # signal.signal() works only on the main thread: reset it through libc
        try:
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            libc.signal.restype = ctypes.c_void_p
            libc.signal.argtypes = (ctypes.c_int, ctypes.c_void_p)
            libc.signal(signum, 0)  # SIG_DFL
        except (OSError, AttributeError):
            os._exit(128 + signum)
    os.kill(os.getpid(), signum)
    time.sleep(1.0)  # the signal ends the process; should it not, leave with its status
    os._exit(128 + signum)


def _after_fork_in_child() -> None:
    """The watcher thread does not survive fork: a child gets its own pipe and thread."""
    global _pipe, _requested, _hooks_done
    _flushing.clear()
    _requested, _hooks_done = False, threading.Event()
    if _pipe is not None:
        inherited = _pipe[1]
        for fd in _pipe:
            try:
                os.close(fd)
            except OSError:
                pass
        _pipe = None
        _start_watcher()
        if _ours() and threading.current_thread() is threading.main_thread():
            try:
                _claim_wakeup_fd(inherited)
            except ValueError:
                pass


os.register_at_fork(after_in_child=_after_fork_in_child)
