"""Every name a scheduling module lists in __all__ exists."""

from __future__ import annotations

import importlib
import pkgutil

import pytest

import picker.scheduling.plugins as plugins_pkg

MODULES = [
    "picker.scheduling",
    "picker.scheduling.config",
    "picker.scheduling.external",
    "picker.scheduling.framework",
    "picker.scheduling.isolation",
    "picker.scheduling.profile",
    "picker.scheduling.registry",
    "picker.scheduling.scheduler",
    "picker.scheduling.scores",
    "picker.scheduling.spec",
    *(f"picker.scheduling.plugins.{m.name}" for m in pkgutil.iter_modules(plugins_pkg.__path__)),
]


@pytest.mark.parametrize("name", MODULES)
def test_all_names_exist(name: str) -> None:
    module = importlib.import_module(name)
    exported = getattr(module, "__all__", None)
    assert exported, f"{name} has no __all__"
    assert len(set(exported)) == len(exported)
    for attr in exported:
        assert hasattr(module, attr), f"{name}.__all__ lists missing {attr}"
