"""`chiptrace record -- torchrun ...`: the command rewritten so that every rank runs under
`chiptrace.torch.profile()`.

`torchrun --nproc-per-node 2 train.py --lr 1` becomes `torchrun --nproc-per-node 2 -m
chiptrace.torch train.py --lr 1`: torchrun's own `-m` starts each rank as `python -m
chiptrace.torch train.py --lr 1`, which runs the script profiled. torchrun's options are
read with torchrun's own argument parser, so the script is found wherever it sits.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

RUNNER = "chiptrace.torch"  # `python -m chiptrace.torch SCRIPT ARGS`: a profiled rank
_LAUNCHERS = ("torch.distributed.run", "torch.distributed.launch")
# Launch modes the runner cannot sit in front of: the script is not a Python file run by
# a new interpreter, or it runs inside the launcher's own process.
_UNWRAPPABLE = ("no_python", "run_path")


def launcher_end(cmd: Sequence[str]) -> int | None:
    """Where torchrun's own arguments start in `cmd` (`torchrun ...`, `python -m
    torch.distributed.run ...`), or None when `cmd` is not a torchrun command."""
    if not cmd:
        return None
    if os.path.basename(cmd[0]) == "torchrun":
        return 1
    if os.path.basename(cmd[0]).startswith("python") and len(cmd) >= 3:
        if cmd[1] == "-m" and cmd[2] in _LAUNCHERS:
            return 3
    return None


def _option(parser: Any, token: str) -> Any:
    """The argparse action `token` names (exactly, by unique prefix, or `-rVALUE`)."""
    table = parser._option_string_actions
    name = token.split("=", 1)[0]
    if name in table:
        return table[name]
    if name.startswith("--"):
        found = {a for opt, a in table.items() if opt.startswith(name)}
        if len(found) == 1:
            return found.pop()
    elif len(name) > 2 and name[:2] in table:
        return table[name[:2]]
    return None


def wrap(cmd: Sequence[str]) -> tuple[list[str], str | None]:
    """(the command with each rank profiled, None) or (the command unchanged, why not)."""
    start = launcher_end(cmd)
    if start is None:
        return list(cmd), "not a torchrun command"
    from torch.distributed.run import get_args_parser  # only for a torchrun command

    parser = get_args_parser()
    opts: list[str] = []
    module = False
    i = start
    while i < len(cmd):
        token = cmd[i]
        if token == "--" or not token.startswith("-"):
            break
        action = _option(parser, token)
        if action is None:
            return list(cmd), f"unknown torchrun option {token!r}"
        if action.dest in _UNWRAPPABLE:
            return list(cmd), f"torchrun {token} runs no Python script of its own"
        if action.dest == "module":
            module = True
            i += 1
            continue
        attached = "=" in token or (not token.startswith("--") and len(token) > 2)
        takes_value = action.nargs != 0 and not attached
        opts += cmd[i : i + 2] if takes_value else [token]
        i += 2 if takes_value else 1
    if i < len(cmd) and cmd[i] == "--":
        i += 1
    if i >= len(cmd):
        return list(cmd), "no training script in the torchrun command"
    target = ["-m", cmd[i]] if module else [cmd[i]]
    return [*cmd[:start], *opts, "-m", RUNNER, *target, *cmd[i + 1 :]], None
