"""Fixtures shared by the lab's tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from picker.bench.policies import PREVIOUS_CONFIG_TEXT


@pytest.fixture
def v1_config(tmp_path: Path) -> Path:
    """picker's first default (``picker-v1``) as a config file."""
    path = tmp_path / "v1.yaml"
    path.write_text(PREVIOUS_CONFIG_TEXT)
    return path
