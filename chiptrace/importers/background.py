"""Imports off the traced program's thread: a separate process takes trace files one by one.

A program that hands a trace over (chiptrace.torch.profile() does, at the end of each
profiling cycle) pays for writing the file and nothing more: a sender thread of its own
prepares what the import needs (the run spans to nest under, chiptrace.importers.within,
read from the recorder's buffer in place) and passes the job to a child
process (`python -m chiptrace.importers.background`), which imports into the trace dir and
removes the file. The child is a fresh interpreter, not a fork, so it shares neither the
GIL nor the program's threads: ~6 us of CPU per profiler event, and ~0.5 s to start, on
another core, at a lower priority (nice 10) so that it takes only CPU the program leaves. `wait()` waits for the jobs handed over; at exit the program waits for them
(at most `EXIT_WAIT_S`) and the child, its input closed, finishes its queue and ends.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

log = logging.getLogger("chiptrace")

EXIT_WAIT_S = 60.0
Done = Callable[[dict[str, Any]], None]  # called with {"spans": n} or {"error": "..."}


class BackgroundImporter:
    """One child process importing jobs in order; thread-safe `submit`, `wait`, `close`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._jobs: queue.Queue[Any] = queue.Queue()
        self._pending: dict[int, tuple[Done, list[Path]]] = {}
        self._sent: dict[int, subprocess.Popen[str]] = {}  # job -> the child it went to
        self._next = 0
        self._proc: subprocess.Popen[str] | None = None
        self._sender: threading.Thread | None = None

    def start(self) -> None:
        """Start the child process (and the sender thread) if they are not running."""
        with self._lock:
            if self._proc is not None and self._proc.poll() is None:
                return
            self._proc = subprocess.Popen(
                [sys.executable, "-m", __name__],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
                bufsize=1,
            )
            proc = self._proc
            if self._sender is None or not self._sender.is_alive():
                self._sender = threading.Thread(
                    target=self._send_loop, name="chiptrace-import-send", daemon=True
                )
                self._sender.start()
        threading.Thread(
            target=self._read_loop, args=(proc,), name="chiptrace-import-read", daemon=True
        ).start()

    def submit(
        self,
        path: Path,
        out: Path,
        prepare: Callable[[], Any],
        done: Done,
        keep: bool = False,
    ) -> None:
        """Import `path` into `out` in the child; `prepare()` (run on the sender thread)
        gives the `Within` to nest under; `done` gets the result; `path` is removed after,
        unless `keep`."""
        self.start()
        with self._lock:
            job = self._next
            self._next += 1
            within = path.with_name(f".{path.name}.within.npz")
            self._pending[job] = (done, [within] if keep else [path, within])
        self._jobs.put((job, path, out, prepare, within))

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until every job handed over has been imported (or failed); False on timeout."""
        with self._idle:
            return self._idle.wait_for(lambda: not self._pending, timeout)

    def close(self, timeout: float = EXIT_WAIT_S) -> None:
        """Wait for the jobs (at most `timeout` s), then let the child end."""
        if not self.wait(timeout):
            log.warning("chiptrace: profiler traces still importing at exit; left to finish")
        self._jobs.put(None)
        proc = self._proc
        if proc is not None and proc.stdin is not None:
            try:
                proc.stdin.close()
            except OSError:
                pass

    # ------------------------------------------------------------ threads

    def _send_loop(self) -> None:
        while (item := self._jobs.get()) is not None:
            job, path, out, prepare, within_path = item
            try:
                prepare().save(within_path)
                line = json.dumps(
                    {"id": job, "path": str(path), "out": str(out), "within": str(within_path)}
                )
                proc = self._proc
                if proc is None or proc.stdin is None:
                    raise OSError("no import process")
                with self._lock:
                    self._sent[job] = proc
                proc.stdin.write(line + "\n")
                proc.stdin.flush()
            except Exception as e:  # noqa: BLE001 - the program goes on; the job fails
                self._finish(job, {"error": f"could not hand the trace over: {e}"})

    def _read_loop(self, proc: subprocess.Popen[str]) -> None:
        for line in proc.stdout or ():
            try:
                result = json.loads(line)
            except ValueError:
                continue
            self._finish(result.pop("id"), result)
        code = proc.wait()
        with self._lock:
            lost = [job for job, to in self._sent.items() if to is proc]
        for job in lost:  # the child ended with jobs in hand
            self._finish(job, {"error": f"the import process ended (exit status {code})"})

    def _finish(self, job: int, result: dict[str, Any]) -> None:
        with self._lock:
            done, files = self._pending.pop(job, (None, []))
            self._sent.pop(job, None)
        for f in files:
            Path(f).unlink(missing_ok=True)
        if done is not None:
            try:
                done(result)
            except Exception:  # noqa: BLE001
                log.exception("chiptrace: import callback failed")
        with self._idle:
            self._idle.notify_all()


_importer: BackgroundImporter | None = None
_importer_lock = threading.Lock()


def importer() -> BackgroundImporter:
    """This process's background importer (waited for at exit)."""
    global _importer
    with _importer_lock:
        if _importer is None:
            from chiptrace.recorder import on_exit

            _importer = BackgroundImporter()
            on_exit(_importer.close)
        return _importer


def _forget_after_fork() -> None:
    global _importer, _importer_lock
    _importer, _importer_lock = None, threading.Lock()


os.register_at_fork(after_in_child=_forget_after_fork)


def main() -> int:
    """The child: one JSON job a line on stdin, one JSON result a line on stdout."""
    try:  # a core the traced program wants is never spent on its imports
        os.nice(10)
    except (AttributeError, OSError):  # no nice (Windows) or not permitted: run as is
        pass
    from chiptrace.importers import import_trace
    from chiptrace.importers.within import Within

    for line in sys.stdin:
        job = json.loads(line)
        result: dict[str, Any] = {"id": job["id"]}
        try:
            within = Within.load(job["within"])
            summary = import_trace(
                [job["path"]], job["out"], format="kineto", workers=0, within=within
            )
            result["spans"] = summary.spans
        except Exception as e:  # noqa: BLE001 - reported to the program, one line
            result["error"] = f"{type(e).__name__}: {e}".splitlines()[0]
        print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
