"""picker.sim exports exactly its public names, and they import without aiohttp."""

from __future__ import annotations

import pkgutil
import subprocess
import sys

import picker.sim


def test_all_names_exist_and_are_public() -> None:
    assert sorted(picker.sim.__all__) == sorted(set(picker.sim.__all__))
    for name in picker.sim.__all__:
        assert getattr(picker.sim, name) is not None
    public = {n for n in vars(picker.sim) if not n.startswith("_")}
    modules = {m.name for m in pkgutil.iter_modules(picker.sim.__path__)}
    assert public - modules == set(picker.sim.__all__)


def test_engine_side_needs_no_http_stack() -> None:
    code = "import sys, picker.sim; print('aiohttp' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
