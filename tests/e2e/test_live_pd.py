"""Prefill/decode disaggregation live: ``picker demo --pd --short`` through the real Envoy, with llm-d's P/D
sample config in ``picker serve`` and llm-d's routing sidecar in front of the decode servers.

    python -m picker.cli demo --pd --short --json pd.json      # what this test runs (~50 s)
"""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from tests.e2e.procs import run_demo

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

TIMEOUT_S = 120.0


def test_disaggregated_serving_through_envoy_with_no_failed_request(tmp_path: Path) -> None:
    run_demo(tmp_path, ["--pd", "--short", "--json", "pd.json", "--png", "pd.png"], TIMEOUT_S)
    doc = orjson.loads((tmp_path / "pd.json").read_bytes())
    aggregated, pd = doc["phases"]
    for phase in (aggregated, pd):
        s = phase["summary"]
        assert s["failed"] == 0
        assert s["ok"] == s["requests"] >= 20
    n = pd["summary"]["requests"]
    # picker disaggregated every request (plus the load client's body-less probe, decode-only).
    assert pd["decisions"].get("prefill-decode", 0) >= n
    assert aggregated["decisions"].get("prefill-decode", 0) == 0
    # The prefill servers computed every prompt; the decode servers pulled them (computing one token each) and
    # answered every client.
    prefill = [st for name, st in pd["stats"].items() if name.startswith("prefill")]
    decode = [st for name, st in pd["stats"].items() if name.startswith("decode")]
    assert sum(st["prefill_tokens"] for st in prefill) >= n * 3072
    assert sum(st["pulled_tokens"] for st in decode) >= n * 3071
    assert sum(st["prefill_tokens"] for st in decode) <= n + 64  # the last prompt token of each, and the probe
    assert set(pd["summary"]["backends"]) <= {"decode-1", "decode-2"}
    # A 3072-token prefill step takes ~0.4 s of engine time. Aggregated, every server runs such steps and every
    # sequence decoding there waits for them; disaggregated, no decode server ever runs one.
    assert all(st["max_step_s"] > 0.35 for st in aggregated["stats"].values() if st["prefill_tokens"])
    assert all(st["max_step_s"] < 0.1 for st in decode)
    a, p = aggregated["summary"], pd["summary"]
    print(
        f"\nlive P/D: worst gap between tokens p90 {aggregated['max_itl_p90_s'] * 1e3:.0f} ms aggregated vs "
        f"{pd['max_itl_p90_s'] * 1e3:.0f} ms P/D; TPOT p90 {a['tpot_s']['p90'] * 1e3:.1f} vs "
        f"{p['tpot_s']['p90'] * 1e3:.1f} ms; TTFT p50 {a['ttft_s']['p50'] * 1e3:.0f} vs "
        f"{p['ttft_s']['p50'] * 1e3:.0f} ms (client-side numbers: noisy on a busy 2-core machine)"
    )
