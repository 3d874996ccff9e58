"""Every picker module says what it exports (``__all__``), and says it truly: each name exists, once. The
packages that gather their submodules' names export every public name they bind."""

from __future__ import annotations

import importlib
import pkgutil
import types

import pytest

import picker

MODULES = sorted(
    m.name for m in pkgutil.walk_packages(picker.__path__, "picker.") if not m.name.rpartition(".")[2].startswith("_")
)
PACKAGES = sorted(m.name for m in pkgutil.walk_packages(picker.__path__, "picker.") if m.ispkg)
# Packages that bind a name from elsewhere for their own use (a type in a signature, the registry's class).
USES_IMPORTS = {"picker.admission", "picker.telemetry"}


@pytest.mark.parametrize("name", MODULES)
def test_all_names_exist_once(name: str) -> None:
    module = importlib.import_module(name)
    exported = getattr(module, "__all__", None)
    if exported is None:  # only a package that binds nothing public may go without
        assert name in PACKAGES, f"{name} has no __all__"
        assert not _public(module), f"{name} binds public names but has no __all__"
        return
    assert len(exported) == len(set(exported)), name
    for attr in exported:
        assert hasattr(module, attr), f"{name}.__all__ lists missing {attr}"


@pytest.mark.parametrize("name", [p for p in PACKAGES if p not in USES_IMPORTS])
def test_packages_export_every_public_name_they_bind(name: str) -> None:
    package = importlib.import_module(name)
    assert _public(package) == set(getattr(package, "__all__", ()))


def test_the_walk_finds_the_tree() -> None:
    assert {"picker.app", "picker.serve", "picker.scheduling.plugins.prefix", "picker.sim.engine"} <= set(MODULES)
    assert {"picker.extproc", "picker.scheduling.plugins"} <= set(PACKAGES)


def _public(module: types.ModuleType) -> set[str]:
    return {
        n
        for n, v in vars(module).items()
        if not n.startswith("_") and not isinstance(v, types.ModuleType) and n != "annotations"
    }
