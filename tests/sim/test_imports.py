"""picker.sim's engine side imports without aiohttp (the lab runs it in processes without the HTTP stack)."""

from __future__ import annotations

import subprocess
import sys


def test_engine_side_needs_no_http_stack() -> None:
    code = "import sys, picker.sim; print('aiohttp' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
