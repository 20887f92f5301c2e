"""Fixtures for chiptrace.torch: PyTorch itself (CI installs a CPU wheel for `-m torch`),
a small real model, and the spans of a trace dir as a tree."""

from __future__ import annotations

from pathlib import Path

import pytest

import chiptrace


@pytest.fixture
def torch():
    """PyTorch, imported only by the tests that use it (collection stays light)."""
    return pytest.importorskip("torch")


@pytest.fixture
def train_step(torch):
    """One real SGD step of a small MLP: forward, loss, backward, update."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(8, 16), torch.randint(0, 4, (8,))

    def step() -> None:
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()

    return step


def read_spans(directory: Path) -> list[dict]:
    chiptrace.flush()
    con = chiptrace.connect(directory)
    return con.sql("SELECT * FROM spans ORDER BY start_ns").to_arrow_table().to_pylist()


def ancestors(row: dict, by_id: dict[str, dict]) -> list[dict]:
    """The spans above `row`, innermost first."""
    out = []
    parent = by_id.get(row["parent_span_id"]) if row["parent_span_id"] else None
    while parent is not None:
        out.append(parent)
        parent = by_id.get(parent["parent_span_id"]) if parent["parent_span_id"] else None
    return out
