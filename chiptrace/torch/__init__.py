"""PyTorch in one line: profiler ops in the same trace as chiptrace spans.

`with chiptrace.torch.profile():` records the block with the PyTorch profiler and imports
each finished profiler trace into the store the chiptrace spans go to, each op and kernel
under the chiptrace span that was open when it ran (docs/torch.md).
`chiptrace.torch.comm(dist.all_reduce, t)` runs a collective as a comm span with its bytes
and group. Needs PyTorch (`pip install 'chiptrace[torch]'`); `import chiptrace` never
imports it.
"""

from __future__ import annotations

from chiptrace.errors import ChiptraceError


class TorchMissingError(ChiptraceError, ImportError):
    """chiptrace.torch was imported where PyTorch is not installed."""


try:
    import torch as _torch  # noqa: F401 - the one check that PyTorch is there
except ImportError:
    raise TorchMissingError(
        "chiptrace.torch needs PyTorch, which is not installed: "
        "pip install 'chiptrace[torch]' (or torch itself)"
    ) from None

from chiptrace.torch._comm import comm  # noqa: E402 - after the check above
from chiptrace.torch._profile import profile  # noqa: E402

__all__ = ["profile", "comm", "TorchMissingError"]
