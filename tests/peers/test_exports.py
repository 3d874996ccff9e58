"""Every name a peers module lists in __all__ exists."""

from __future__ import annotations

import importlib

import pytest

MODULES = [
    "picker.peers",
    "picker.peers.discovery",
    "picker.peers.exchange",
    "picker.peers.metrics",
    "picker.peers.node",
    "picker.peers.transport",
    "picker.peers.wire",
    "picker.endpoints.peerload",
]


@pytest.mark.parametrize("name", MODULES)
def test_all_names_exist(name: str) -> None:
    module = importlib.import_module(name)
    exported = getattr(module, "__all__", None)
    assert exported, f"{name} has no __all__"
    assert len(set(exported)) == len(exported)
    for attr in exported:
        assert hasattr(module, attr), f"{name}.__all__ lists missing {attr}"
