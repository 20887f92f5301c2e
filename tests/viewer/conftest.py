"""Viewer fixtures: a synthetic rack trace dir with known load."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from viewer_rack import write_rack  # noqa: E402


@pytest.fixture
def rack_dir(tmp_path: Path) -> Path:
    """Ten 100 ms steps of the synthetic rack, in two Parquet parts."""
    return write_rack(tmp_path / "rack")
