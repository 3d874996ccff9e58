"""``picker bench gateways`` on NGINX Gateway Fabric's path (NGF's shim and epp.js), end to end and short."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import orjson
import pytest

pytestmark = pytest.mark.e2e


def test_ngf_phases_run_and_stop_cleanly(tmp_path: Path) -> None:
    out = tmp_path / "gateways.json"
    argv = ["bench", "gateways", "--gateways", "ngf", "--duration", "3", "--rate", "4", "--json", str(out)]
    run = subprocess.run(
        [sys.executable, "-m", "picker.cli", *argv], capture_output=True, text=True, timeout=180, check=False
    )
    assert run.returncode == 0, run.stdout + run.stderr  # NGF's shim, stopped by SIGTERM, counts as a clean stop
    doc = orjson.loads(out.read_bytes())
    assert [p["label"] for p in doc["phases"]] == ["nginx pool upstream", "ngf + picker"]
    for phase in doc["phases"]:
        assert phase["summary"]["failed"] == 0
        assert phase["summary"]["ok"] == phase["summary"]["requests"] > 5
    assert set(doc["added_ttft_p50_s"]) == {"ngf"}
    assert "ngf: picker's path adds" in run.stdout
