"""Fixtures for analysis tests."""

from __future__ import annotations

import pytest
from analysis_helpers import TraceBuilder


@pytest.fixture
def builder() -> TraceBuilder:
    """Collects spans and writes them as a real trace dir (one Parquet part)."""
    return TraceBuilder()
