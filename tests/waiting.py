"""Waiting in tests: poll a condition until a deadline, never a bare sleep.

A fixed sleep is either too short on a loaded machine (a flaky test) or longer than needed
everywhere else (a slow suite); polling with a generous deadline is neither.
"""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_until(
    cond: Callable[[], object], what: str, timeout_s: float = 30.0, poll_s: float = 0.01
) -> None:
    """Return once `cond()` is true; fail the test naming `what` after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout_s:g} s")
        time.sleep(poll_s)
