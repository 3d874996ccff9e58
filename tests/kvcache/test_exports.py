"""Every name a kvcache or kvevents module lists in __all__ exists."""

from __future__ import annotations

import importlib

import pytest

MODULES = [
    "picker.kvcache.events",
    "picker.kvcache.index",
    "picker.kvcache.ingest",
    "picker.kvcache.keys",
    "picker.kvcache",
    "picker.kvevents",
    "picker.kvevents.subscriber",
    "picker.kvevents.tokens",
    "picker.bench.kv_index",
    "picker.bench.kv_lab",
    "picker.bench.kv_live",
    "picker.bench.lab_kv",
    "picker.telemetry.kvmetrics",
    "picker.scheduling.plugins.precise_prefix",
    "picker.scheduling.plugins.token_producer",
    "picker.sim.kvevents",
]


@pytest.mark.parametrize("name", MODULES)
def test_all_names_exist(name: str) -> None:
    module = importlib.import_module(name)
    exported = getattr(module, "__all__", None)
    assert exported, f"{name} has no __all__"
    assert len(set(exported)) == len(exported)
    for attr in exported:
        assert hasattr(module, attr), f"{name}.__all__ lists missing {attr}"
