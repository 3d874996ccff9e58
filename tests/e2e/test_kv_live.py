"""The precise path live: simulated servers publishing KV events, two ``picker serve`` replicas behind the real
Envoy, the load client through Envoy (``picker bench kv-live`` at CI size, ~25 s)."""

from __future__ import annotations

import argparse
from pathlib import Path

import orjson
import pytest

from picker.bench import kv_live

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def test_precise_replicas_behind_envoy_serve_every_request_and_hit_the_cache(tmp_path: Path) -> None:
    parser = argparse.ArgumentParser()
    kv_live.configure(parser)
    out = tmp_path / "live.json"
    args = parser.parse_args(
        ["--configs", "precise", "--replicas", "2", "--sims", "2", "--num-gpu-blocks", "256", "--system-len", "512",
         "--ratio", "1", "--rate", "4", "--duration", "8", "--json", str(out)]
    )  # fmt: skip
    assert kv_live.run(args) == 0
    (row,) = orjson.loads(out.read_bytes())["rows"]
    summary = row["summary"]
    assert summary["failed"] == 0
    assert summary["ok"] >= 20
    # 8 groups of 8 prompts at 4 req/s: most prompts repeat a group seen before, on the server holding it
    assert row["cached_share"] > 0.3
