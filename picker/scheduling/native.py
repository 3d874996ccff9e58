"""Which native hot path is in use: ``picker.scheduling._native`` (a small C extension) or none.

``scripts/install.sh`` builds the extension from ``picker/scheduling/_native.c`` (setup.py; optional: without a C
compiler the install goes on). Every native function has a pure-Python twin that defines its result and is used
when the extension is missing or ``PICKER_NATIVE=0``; tests check both equal on randomized inputs
(tests/scheduling/plugins/test_native.py).
"""

from __future__ import annotations

import os
from types import ModuleType

__all__ = ["NATIVE", "load", "module"]


def load() -> ModuleType | None:
    """The extension, or None when it is not built or ``PICKER_NATIVE`` is ``0``."""
    if os.environ.get("PICKER_NATIVE", "1") == "0":
        return None
    try:
        from picker.scheduling import _native
    except ImportError:  # not built (no compiler at install): the pure-Python twins
        return None
    return _native


module = load()
NATIVE = module is not None  # whether the C extension is in use
