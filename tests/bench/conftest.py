"""Fixtures shared by the lab's tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from picker.bench.policies import V2_CONFIG_TEXT


@pytest.fixture
def home_config(tmp_path: Path) -> Path:
    """picker's previous default (``picker-v2``) with ``coldSpreadHome: true`` under its prefix-cache-scorer, as a
    config file."""
    anchor = "coldSpreadDebtLimit: 1"
    assert V2_CONFIG_TEXT.count(anchor) == 1  # the line the option goes under
    path = tmp_path / "home.yaml"
    path.write_text(V2_CONFIG_TEXT.replace(anchor, f"{anchor}\n    coldSpreadHome: true"))
    return path
