"""The lab's routing policies, one decision at a time: baselines and picker's scheduler behind the same API."""

from __future__ import annotations

import random

import pytest

from picker import errors
from picker.bench.policies import (
    POLICY_NAMES,
    CacheAware,
    LMetric,
    PrefixSets,
    SchedulerPolicy,
    make_policy,
)
from picker.endpoints.inflight import InflightTracker
from picker.endpoints.model import Endpoint, EndpointMetrics
from picker.scheduling.framework import PluginContext, ResponseInfo
from tests.conftest import FakeClock, endpoint, request

EPS = [endpoint(i) for i in (1, 2, 3, 4)]


def ctx(seed: int = 0, clock: FakeClock | None = None) -> PluginContext:
    return PluginContext(clock=clock or FakeClock(), inflight=InflightTracker(), rng=random.Random(seed))


def load(c: PluginContext, ep: Endpoint, n: int) -> None:
    for _ in range(n):
        c.inflight.acquire(ep.key, 10, 0.0)


def test_every_name_makes_a_policy_and_unknown_names_are_refused() -> None:
    c = ctx()
    for name in POLICY_NAMES:
        if name != "config:PATH":
            assert make_policy(name, c).name == name
    assert make_policy("round-robin", c).name == "rr"
    assert make_policy("power-of-two", c).name == "p2c"
    assert make_policy("least-request", c).name == "lc"
    with pytest.raises(ValueError, match="unknown policy 'fastest'"):
        make_policy("fastest", c)
    with pytest.raises(errors.ConfigError, match="cannot read config file"):
        make_policy("config:/nonexistent/picker.yaml", c)


def test_round_robin_cycles_over_candidates_by_key() -> None:
    rr = make_policy("rr", ctx())
    shuffled = [EPS[2], EPS[0], EPS[3], EPS[1]]
    assert [rr.pick(request(), shuffled).endpoint for _ in range(5)] == [*EPS, EPS[0]]


def test_least_connections_picks_the_fewest_in_flight_with_random_ties() -> None:
    c = ctx()
    lc = make_policy("lc", c)
    load(c, EPS[0], 3)
    load(c, EPS[1], 1)
    load(c, EPS[2], 1)
    load(c, EPS[3], 2)
    assert {lc.pick(request(), EPS).endpoint for _ in range(30)} == {EPS[1], EPS[2]}


def test_power_of_two_takes_the_less_loaded_of_two_random_candidates() -> None:
    c = ctx()
    p2c = make_policy("p2c", c)
    load(c, EPS[3], 5)
    picks = [p2c.pick(request(), EPS).endpoint for _ in range(200)]
    # Whichever candidate EPS[3] is drawn with has fewer in flight, so EPS[3] is never chosen.
    assert EPS[3] not in picks
    assert set(picks) == set(EPS[:3])
    assert p2c.pick(request(), EPS[:1]).endpoint == EPS[0]


def test_random_is_seeded() -> None:
    def picks(seed: int) -> list[Endpoint]:
        policy = make_policy("random", ctx(seed))
        return [policy.pick(request(), EPS).endpoint for _ in range(50)]

    assert picks(5) == picks(5)
    assert picks(5) != picks(6)
    assert set(picks(1)) == set(EPS)


def test_prefix_sets_match_leading_blocks_and_evict_least_recent() -> None:
    sets = PrefixSets(block_chars=4)
    h = sets.hashes("aaaabbbbcc", "m")
    assert len(h) == 3  # two full blocks and the partial tail
    assert sets.hashes("aaaabbbbcc", "other") != h  # the model seeds the chain
    sets.insert("x", h[:2])
    assert sets.matched("x", h) == 2
    assert sets.matched("x", sets.hashes("aaaaXbbbcc", "m")) == 1
    assert sets.matched("y", h) == 0
    sets.insert("x", sets.hashes("zzzzyyyy", "m"), capacity_blocks=3)
    assert sets.size("x") == 3
    # The first block of the newest text is kept longest; the oldest text's tail went first.
    assert sets.matched("x", h) == 1


def test_cache_aware_follows_the_longest_match_above_the_threshold() -> None:
    c = ctx()
    policy = CacheAware(c, block_chars=8)
    prompt = "system prompt shared by everyone " * 4
    first = policy.pick(request(prompt=prompt + "q1"), EPS).endpoint
    assert first == EPS[0]  # all trees empty: the smallest tree, first in order
    second = policy.pick(request(prompt=prompt + "q2"), EPS).endpoint
    assert second == first  # most of the prompt matches that worker's tree
    other = policy.pick(request(prompt="a completely different text, long enough" * 3), EPS).endpoint
    assert other != first  # below the threshold: the smallest tree (an empty one)


def test_cache_aware_balances_when_load_is_skewed() -> None:
    c = ctx()
    policy = CacheAware(c, block_chars=8)
    prompt = "system prompt shared by everyone " * 4
    assert policy.pick(request(prompt=prompt), EPS).endpoint == EPS[0]
    load(c, EPS[0], 40)
    load(c, EPS[1], 2)
    load(c, EPS[2], 1)
    load(c, EPS[3], 3)
    # 40 - 1 > 32 and 40 > 1 x 1.1: imbalanced, so the least loaded worker despite the cached prefix.
    assert policy.pick(request(prompt=prompt), EPS).endpoint == EPS[2]


def test_cache_aware_trims_trees_every_eviction_interval() -> None:
    clock = FakeClock()
    policy = CacheAware(ctx(clock=clock), block_chars=8, max_tree_chars=16, eviction_interval_s=30.0)
    policy.pick(request(prompt="x" * 80), EPS)
    assert policy.trees.size(EPS[0].key) == 10
    clock.advance(31.0)
    policy.pick(request(prompt="y" * 8), EPS)
    assert policy.trees.size(EPS[0].key) == 2  # trimmed to 16 characters before this pick


def test_lmetric_trades_uncached_tokens_against_load() -> None:
    c = ctx()
    policy = LMetric(c, block_chars=8)
    prompt = "a long shared system prompt, " * 20
    req = request(prompt=prompt + "q", prompt_tokens=150)
    home = policy.pick(req, EPS).endpoint
    assert policy.pick(req, EPS).endpoint == home  # cached there: ~1 uncached token x (0 + 1)
    load(c, home, 200)  # 1 x 201 > 150 x 1: a cold, idle worker is now cheaper
    assert policy.pick(req, EPS).endpoint != home


def test_lmetric_bounds_its_sets_by_the_endpoints_kv_size() -> None:
    small = Endpoint.create("10.0.0.9", 8000)
    small = Endpoint(
        key=small.key, address=small.address, port=small.port, metrics=EndpointMetrics(block_size=16, num_gpu_blocks=3)
    )
    policy = LMetric(ctx(), block_chars=64)
    policy.pick(request(prompt="z" * 64 * 10), [small])
    assert policy.sets.size(small.key) == 3


def test_scheduler_policy_runs_the_production_hooks() -> None:
    c = ctx()
    policy = make_policy("reference", c)
    assert isinstance(policy, SchedulerPolicy)
    prompt = "You are a helpful assistant. " * 20
    first = policy.pick(request(prompt=prompt + "one"), EPS)
    assert first.result is not None
    assert first.endpoint == first.result.targets[0]
    policy.routed(request(prompt=prompt + "one"), first)  # PreRequest: the prefix index learns the pick
    again = policy.pick(request(prompt=prompt + "two"), EPS)
    assert again.endpoint == first.endpoint
    policy.completed(request(), ResponseInfo(endpoint_key=first.endpoint.key, status=200))


def test_envoy_least_request_draws_two_hosts_with_replacement() -> None:
    """Envoy's N_CHOICES: two draws that may hit the same host; the second wins only with strictly fewer."""
    c = ctx(seed=1)
    policy = make_policy("envoy-least-request", c)
    for ep in EPS[1:]:
        load(c, ep, 1)
    rng = random.Random(1)  # the draws the policy will make
    picks = []
    for _ in range(400):
        a, b = EPS[rng.randrange(4)], EPS[rng.randrange(4)]
        want = b if c.inflight.requests(b.key) < c.inflight.requests(a.key) else a
        got = policy.pick(request(), EPS).endpoint
        assert got == want
        picks.append(got)
    # The idle host wins whenever it is drawn (7 in 16 pairs); a pair without it picks its first host.
    assert picks.count(EPS[0]) / len(picks) == pytest.approx(7 / 16, abs=0.07)
