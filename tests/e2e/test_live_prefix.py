"""The live check of picker's default: shared prefixes through the real Envoy and ``picker serve`` (its built-in
default configuration) over simulated servers, against Envoy's own round robin (``picker demo``, run long enough
that the p90 is past the cold first requests of each prompt group).

    python -m picker.cli demo --duration 25 --json demo.json     # what this test runs (~65 s)
"""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from tests.e2e.procs import run_demo

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

DURATION_S = 25  # per phase: ~200 requests at 8 req/s, of which the 16 cold group starts are < 10 %
TIMEOUT_S = 88.0


def test_picker_default_beats_envoy_round_robin_on_p90_ttft(tmp_path: Path) -> None:
    run_demo(tmp_path, ["--duration", str(DURATION_S), "--json", "demo.json", "--png", "demo.png"], TIMEOUT_S)
    doc = orjson.loads((tmp_path / "demo.json").read_bytes())
    rr, picker = (phase["summary"] for phase in doc["phases"])
    for s in (rr, picker):
        assert s["ok"] == s["requests"] > 150
    ratio = rr["ttft_s"]["p90"] / picker["ttft_s"]["p90"]
    print(
        f"\nlive shared-prefix, {DURATION_S} s per phase: TTFT p90 round robin {rr['ttft_s']['p90'] * 1e3:.0f} ms, "
        f"picker {picker['ttft_s']['p90'] * 1e3:.0f} ms ({ratio:.2f}x lower); p50 {doc['ratios']['ttft_p50']:.2f}x "
        f"lower; cached {picker['cached_tokens'] / picker['prompt_tokens']:.0%} vs "
        f"{rr['cached_tokens'] / rr['prompt_tokens']:.0%}"
    )
    assert picker["ttft_s"]["p90"] < rr["ttft_s"]["p90"]
    assert picker["cached_tokens"] / picker["prompt_tokens"] > rr["cached_tokens"] / rr["prompt_tokens"]
