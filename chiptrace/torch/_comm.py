"""`chiptrace.torch.comm(dist.all_reduce, t)`: a torch.distributed collective as a comm span.

The span is named after the collective, has `op.kind` comm, `op.bytes` (the larger of what
goes in and what comes out: the tensors, or the lists of tensors, among its arguments; the
rule NCCL's message sizes follow in profiler traces), and the group: `comm.group` (its
name), `comm.group_size`, `comm.group_ranks`. A CUDA tensor puts it on `gpu:<device>`. With
`async_op=True` the span covers the call that starts the collective, not its completion.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import torch
import torch.distributed as dist

from chiptrace.api import span

R = TypeVar("R")


def _bytes(value: Any) -> int:
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, (list, tuple)):
        return sum(_bytes(v) for v in value if isinstance(v, torch.Tensor))
    return 0


def _first_tensor(values: Any) -> torch.Tensor | None:
    for v in values:
        if isinstance(v, torch.Tensor):
            return v
        if isinstance(v, (list, tuple)):
            found = _first_tensor(v)
            if found is not None:
                return found
    return None


def _group_attributes(group: Any) -> dict[str, Any]:
    if not dist.is_available() or not dist.is_initialized():
        return {}
    g = group if group is not None else dist.group.WORLD
    out: dict[str, Any] = {"comm.group_size": dist.get_world_size(g)}
    name = getattr(g, "group_name", None)
    if isinstance(name, str) and name:
        out["comm.group"] = name
    try:
        out["comm.group_ranks"] = list(dist.get_process_group_ranks(g))
    except (RuntimeError, ValueError):  # a group this rank is not in
        pass
    return out


def comm(fn: Callable[..., R], /, *args: Any, **kwargs: Any) -> R:
    """Call the collective `fn(*args, **kwargs)` inside a comm span; returns its result.

    `chiptrace.torch.comm(dist.all_reduce, grad, group=g)` is `dist.all_reduce(grad,
    group=g)` traced: bytes, group name, size and ranks on the span (module docstring).

    Raises:
        TypeError: `fn` is not callable. Whatever `fn` raises propagates unchanged.
    """
    if not callable(fn):
        raise TypeError(
            f"chiptrace.torch.comm expects a torch.distributed collective such as "
            f"dist.all_reduce first, got {type(fn).__name__} {fn!r:.60}"
        )
    values = [*args, *kwargs.values()]
    nbytes = max((_bytes(v) for v in values), default=0)
    first = _first_tensor(values)
    chip = f"gpu:{first.device.index or 0}" if first is not None and first.is_cuda else None
    attributes: dict[str, Any] = {"comm.collective": getattr(fn, "__name__", repr(fn))}
    attributes.update(_group_attributes(kwargs.get("group")))
    if nbytes:
        attributes["op.bytes"] = nbytes
    if kwargs.get("async_op"):
        attributes["comm.async_op"] = True
    with span(attributes["comm.collective"], chip=chip, op="comm", attributes=attributes):
        return fn(*args, **kwargs)
