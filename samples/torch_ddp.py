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


def train(steps: int) -> None:
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(4, 8)
    for i in range(steps):
        with chiptrace.span("step", attributes={"step": i}):
            opt.zero_grad()
            forward(model, x).sum().backward()
            opt.step()
            chiptrace.torch.comm(dist.all_reduce, torch.ones(256))


def main() -> None:
    dist.init_process_group("gloo")
    # The model is freed when train() returns, before the process group is destroyed: DDP's
    # reducer holds the group, and freeing it after destroy_process_group() can hang in
    # gloo's destructor (seen with torch 2.13 in about 1 run of 4).
    train(3)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
