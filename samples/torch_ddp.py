"""A data-parallel training job traced by chiptrace: each step a `step` span, the forward on
this rank's GPU (`chip="gpu"`: gpu:<LOCAL_RANK>), an all-reduce as a comm span.

    chiptrace record --out runs/ddp -- torchrun --standalone --nproc-per-node 2 samples/torch_ddp.py

Each rank runs under chiptrace.torch.profile() (record does that for torchrun), so its
PyTorch ops land in the same store, under its step spans. CPU and gloo: no GPU needed.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

import chiptrace
import chiptrace.torch


@chiptrace.trace(chip="gpu")  # gpu:<LOCAL_RANK>: which rank's device, by name
def forward(model: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    return model(x)


def main() -> None:
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(4, 8)
    for i in range(3):
        with chiptrace.span("step", attributes={"step": i}):
            opt.zero_grad()
            forward(model, x).sum().backward()
            opt.step()
            chiptrace.torch.comm(dist.all_reduce, torch.ones(256))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
