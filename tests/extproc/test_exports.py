"""The packages and modules of this layer export exactly their public names."""

from __future__ import annotations

import importlib
import types

import pytest

MODULES = [
    "picker.app",
    "picker.control",
    "picker.control.accounting",
    "picker.control.director",
    "picker.extproc",
    "picker.extproc.gateways",
    "picker.extproc.health",
    "picker.extproc.response_path",
    "picker.extproc.responses",
    "picker.extproc.servicer",
    "picker.extproc.stream",
    "picker.extproc.tls",
    "picker.telemetry.fast",
    "picker.telemetry.logs",
    "picker.telemetry.metrics",
]


@pytest.mark.parametrize("name", MODULES)
def test_all_names_exist_once(name: str) -> None:
    module = importlib.import_module(name)
    exported = module.__all__
    assert len(exported) == len(set(exported))
    for attr in exported:
        assert hasattr(module, attr), f"{name}.{attr}"


@pytest.mark.parametrize("name", ["picker.control", "picker.extproc"])
def test_packages_export_every_public_non_module_name(name: str) -> None:
    package = importlib.import_module(name)
    public = {n for n, v in vars(package).items() if not n.startswith("_") and not isinstance(v, types.ModuleType)}
    assert public == set(package.__all__)
