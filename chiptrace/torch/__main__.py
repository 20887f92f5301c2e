"""`python -m chiptrace.torch SCRIPT.py ARGS...` (or `-m MODULE ARGS...`): run a PyTorch
program under `chiptrace.torch.profile()`.

`chiptrace record -- torchrun ... train.py` starts each rank this way (torchrun's `-m`), so
every rank's profiler trace joins the store the record writes. The whole run is recorded;
each optimizer step ends a profiler step (`ProfilerStep#N`), unless the program calls
`chiptrace.torch.profile()` itself, whose `step()` then marks them instead.
"""

from __future__ import annotations

import os
import runpy
import sys
from typing import Any

from chiptrace.errors import ChiptraceError

USAGE = "usage: python -m chiptrace.torch SCRIPT.py ARGS... | -m MODULE ARGS..."


class _OptimizerSteps:
    """Advance the profile at each optimizer step, until the program steps it itself."""

    def __init__(self, prof: Any) -> None:
        import torch.optim.optimizer as optim

        self.prof = prof
        self.handle = optim.register_optimizer_step_post_hook(self)

    def __call__(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if self.prof.stepped_by_program:
            self.handle.remove()
        else:
            self.prof._step(by_program=False)


def record_always(step: int) -> Any:
    """A schedule that records every step: with a schedule, and only then, torch marks each
    step as a `ProfilerStep#N` span."""
    from torch.profiler import ProfilerAction

    return ProfilerAction.RECORD


def run(argv: list[str]) -> None:
    """Run the program `argv` names as `python` would, profiled.

    Raises:
        ChiptraceError: no program named.
    """
    from chiptrace.torch import profile

    if not argv or (argv[0] == "-m" and len(argv) < 2):
        raise ChiptraceError(USAGE)
    as_module = argv[0] == "-m"
    target = argv[1] if as_module else argv[0]
    sys.argv = argv[1:] if as_module else argv
    with profile(schedule=record_always) as prof:
        steps = _OptimizerSteps(prof)
        try:
            if as_module:
                runpy.run_module(target, run_name="__main__", alter_sys=True)
            else:
                sys.path.insert(0, os.path.dirname(os.path.abspath(target)))
                runpy.run_path(target, run_name="__main__")
        finally:
            steps.handle.remove()


def main() -> int:
    try:
        run(sys.argv[1:])
    except ChiptraceError as e:
        print(f"chiptrace.torch: {e}", file=sys.stderr)
        return e.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
