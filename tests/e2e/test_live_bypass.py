"""Live through the real Envoy: picker moves gateway traffic off a server that a bypassing client keeps busy.

``picker bench bypass`` at CI size: two simulated servers, a second client sending long requests straight to
server-2. picker's previous default (its own ledger only) cannot see that load; the built-in default reads it
from the servers' /metrics and sends the gateway's requests to server-1.
"""

from __future__ import annotations

import asyncio

import pytest

from picker.bench import bypass, envoy

pytestmark = pytest.mark.e2e


def test_default_sends_gateway_traffic_away_from_a_server_busy_with_bypassing_load() -> None:
    plan = bypass.BypassPlan(duration_s=8.0, warmup_s=3.0)
    results = {r.label: r for r in asyncio.run(bypass.run_phases(plan, envoy.envoy_binary()))}
    previous, default = results["picker-v1"], results["default"]
    for r in (previous, default):
        assert r.gateway.failed == 0
        assert r.bypass.failed == 0
        assert r.gateway.ok >= 0.8 * plan.gateway_rate * plan.duration_s
    # Blind to the bypass, the previous default splits the gateway's requests about evenly.
    assert previous.shares["server-1"] < 0.65, previous.shares
    # The default follows server-2's growing queue and keeps most of them off it: their tail is far shorter.
    assert default.shares["server-1"] > 0.7, default.shares
    assert default.gateway.ttft_s.p90 < 0.5 * previous.gateway.ttft_s.p90
