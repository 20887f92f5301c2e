"""Fixtures for the importer tests: the real Kineto / Jaeger files vendored under tests/fixtures."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
KINETO = FIXTURES / "kineto"
JAEGER = FIXTURES / "jaeger"
KINETO_FILES = sorted(p.name for p in KINETO.glob("*.json.gz"))


def load_events(name: str) -> dict:
    with gzip.open(KINETO / name, "rb") as fh:
        return json.load(fh)


@pytest.fixture(scope="session")
def imported(tmp_path_factory):
    """Import each Kineto fixture once per session: name -> (trace dir, summary)."""
    from chiptrace import import_trace

    cache: dict[str, tuple[Path, object]] = {}

    def get(name: str):
        if name not in cache:
            out = tmp_path_factory.mktemp(name.split(".")[0])
            cache[name] = (out, import_trace(KINETO / name, out))
        return cache[name]

    return get
