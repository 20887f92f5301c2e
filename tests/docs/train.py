"""The reader's `train.py` in the docs (`chiptrace record --out run1 -- python train.py`):
a small decorated training loop, no arguments needed beyond those the docs pass."""

import argparse

import chiptrace


@chiptrace.trace(chip="gpu:0", precision="bf16")
def forward(batch):
    return sum(batch)


@chiptrace.trace(link="pcie5:cpu:0-gpu:0")
def copy_in(batch):
    return list(batch)


parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=1)
for epoch in range(parser.parse_args().epochs):
    for step in range(4):
        with chiptrace.span("train_step") as s:
            forward(copy_in(range(1024)))
            s.set_attribute("step", epoch * 4 + step)
