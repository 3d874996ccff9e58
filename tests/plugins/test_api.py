"""The public plugin API: its names, the context's read-only views, and that built-ins satisfy its protocols."""

from __future__ import annotations

import importlib
import math

import pytest

import picker.plugins as api
from picker.endpoints.inflight import InflightTracker
from picker.plugins import PluginContext
from picker.scheduling import framework, registry
from picker.scheduling.config import load_config
from picker.scheduling.plugins import max_score, queue
from tests.conftest import FakeClock, endpoint
from tests.scheduling.helpers import INTEGRATION, ctx


@pytest.mark.parametrize(
    "name", ["picker.plugins", "picker.plugins.api", "picker.plugins.params", "picker.plugins.results"]
)
def test_all_names_exist(name: str) -> None:
    module = importlib.import_module(name)
    exported = module.__all__
    assert len(set(exported)) == len(exported)
    for attr in exported:
        assert hasattr(module, attr), f"{name}.__all__ lists missing {attr}"


def test_the_engine_uses_the_public_types() -> None:
    """One API: the framework re-exports the public classes, it does not define look-alikes."""
    for name in ("Category", "CycleState", "PluginContext", "ProfileResult", "ScoredEndpoint", "SchedulingResult"):
        assert getattr(framework, name) is getattr(api, name)
    assert framework.ROTATE_TIES is api.ROTATE_TIES
    assert issubclass(framework.Scorer, api.Scorer)
    assert api.ENTRY_POINT_GROUP == "picker.plugins"


def test_builtin_plugins_satisfy_the_public_protocols() -> None:
    config = load_config(INTEGRATION, ctx())
    for name in ("queue-scorer", "kv-cache-utilization-scorer", "prefix-cache-scorer", "lora-affinity-scorer"):
        assert isinstance(config.plugins[name], api.Scorer)
    assert isinstance(config.profiles["default"].picker, api.Picker)
    assert isinstance(queue.QueueScorer("q"), framework.Scorer)
    assert isinstance(max_score.MaxScorePicker("m"), framework.Picker)
    # Every built-in's parameters are a public PluginParams.
    assert all(issubclass(spec.params, api.PluginParams) for spec in registry.BUILTINS.values())


def test_load_is_picker_own_count_and_observations() -> None:
    tracker = InflightTracker()
    c = PluginContext(clock=FakeClock(), inflight=tracker)
    ep = endpoint(1)
    fresh = c.load(ep)
    assert (fresh.requests, fresh.tokens, fresh.ttft_s, fresh.tpot_s) == (0, 0, None, None)
    tracker.acquire(ep.key, 120, now=0.0)
    tracker.acquire(ep.key, 30, now=0.0)
    tracker.observe(ep.key, ttft_s=0.2, tpot_s=0.02)
    load = c.load(ep)
    assert (load.requests, load.tokens, load.ttft_s, load.tpot_s) == (2, 150, 0.2, 0.02)


def test_metrics_age() -> None:
    clock = FakeClock(start=1000.0)
    c = PluginContext(clock=clock, inflight=InflightTracker())
    assert c.metrics_age_s(endpoint(1, updated_at=997.5)) == pytest.approx(2.5)
    clock.advance(1.0)
    assert c.metrics_age_s(endpoint(1, updated_at=997.5)) == pytest.approx(3.5)
    assert c.metrics_age_s(endpoint(1, updated_at=0.0)) == math.inf  # never scraped
