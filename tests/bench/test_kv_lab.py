"""``picker bench kv-lab`` and ``kv-live`` at CI size: the tables come from real runs."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
import yaml

from picker.bench import kv_lab, kv_live


def args_for(module: object, *argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    module.configure(parser)  # type: ignore[attr-defined]
    return parser.parse_args(list(argv))


def test_kv_lab_cell_at_a_small_size() -> None:
    args = args_for(kv_lab, "--engines", "2", "--num-gpu-blocks", "256", "--system-len", "512", "--requests", "120",
                    "--rate", "6")  # fmt: skip
    cells = kv_lab.run_cell(args, ratio=2.0, replicas=2, seeds=[0])
    by_config = {c.config: c for c in cells}
    assert set(by_config) == set(kv_lab.CONFIGS)
    assert all(c.ok == 120 and c.failed == 0 for c in cells)
    assert by_config["none"].hit_rate < by_config["precise"].hit_rate


def test_kv_lab_command(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    out = tmp_path / "kv.json"
    args = args_for(kv_lab, "--engines", "2", "--num-gpu-blocks", "256", "--system-len", "512", "--requests", "60",
                    "--ratios", "1", "--replicas", "1", "--seeds", "0", "--json", str(out))  # fmt: skip
    assert kv_lab.run(args) == 0
    assert "precise" in capsys.readouterr().out
    assert out.exists()
    assert kv_lab.run(args_for(kv_lab, "--ratios", "x")) == 2


def test_kv_live_config_points_the_subscriber_at_this_runs_servers() -> None:
    text = kv_live._config_text(kv_lab.EXAMPLES / "precise.yaml", 6123)
    doc = yaml.safe_load(text)
    (precise,) = [p for p in doc["plugins"] if p["type"] == "precise-prefix-cache-scorer"]
    assert precise["parameters"]["kvEventsConfig"]["podDiscoveryConfig"]["socketPort"] == 6123
    assert yaml.safe_load(kv_live._config_text(kv_lab.EXAMPLES / "none.yaml", 6123)) == yaml.safe_load(
        (kv_lab.EXAMPLES / "none.yaml").read_text()
    )
