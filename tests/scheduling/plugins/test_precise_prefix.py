"""precise-prefix-cache-scorer: scores from the KV-event index, tiers, block sizes, speculation, fail-open."""

from __future__ import annotations

import pytest

from picker import errors
from picker.endpoints.model import Endpoint
from picker.kvcache.events import BlockStored
from picker.scheduling.config import load_config
from picker.scheduling.framework import Category, CycleState, ProfileResult, SchedulingResult
from picker.scheduling.plugins import precise_prefix, prefix
from picker.telemetry import kvmetrics
from tests.conftest import FakeClock, endpoint, request
from tests.scheduling.helpers import HEAD, by_key, ctx, with_cache_geometry

EPS = [endpoint(1), endpoint(2), endpoint(3)]
MODEL = "my-model"


def scorer(**params: object) -> precise_prefix.PrecisePrefixCacheScorer:
    s = precise_prefix.create("precise", precise_prefix.Params.model_validate(params), ctx())
    assert isinstance(s, precise_prefix.PrecisePrefixCacheScorer)
    return s


def store(s: precise_prefix.PrecisePrefixCacheScorer, ep: Endpoint, tokens: list[int], medium: str = "gpu") -> None:
    """What the server's BlockStored for these tokens does (engine hashes made up: only tokens name blocks)."""
    n = len(tokens) // 16
    hashes = tuple(1000 * ep.port + hash(ep.key) % 997 + i for i in range(n))
    s.index.apply(ep.key, MODEL, [BlockStored(hashes, None, tokens[: n * 16], 16, None, medium)])


def result(target: Endpoint, cycle: CycleState | None = None) -> SchedulingResult:
    return SchedulingResult(
        targets=(target,),
        primary_profile="default",
        runs=(),
        profile_results={"default": ProfileResult((target,))},
        cycle=cycle,
    )


TOKENS = list(range(100, 164))  # 4 blocks of 16


def test_score_is_the_weighted_run_over_the_request_blocks() -> None:
    s = scorer()
    assert s.category is Category.AFFINITY
    store(s, EPS[0], TOKENS)
    store(s, EPS[1], TOKENS[:32], medium="cpu")
    req = request(prompt="x", token_ids=[*TOKENS, 1, 2, 3])  # the partial tail is not a block
    got = by_key(s.score(req, EPS, CycleState()))
    assert got == {EPS[0].key: 1.0, EPS[1].key: 0.4, EPS[2].key: 0.0}  # 2 blocks x 0.8 / 4


def test_match_left_for_later_plugins_in_tokens() -> None:
    s = scorer()
    store(s, EPS[0], TOKENS[:32])
    cycle = CycleState()
    s.score(request(token_ids=TOKENS), EPS, cycle)
    match = cycle[prefix.MATCH_STATE]
    assert match.total_blocks == 4
    assert match.blocks == {EPS[0].key: 2}
    assert match.matched_tokens(EPS[0].key) == 32.0
    assert match.uncached_tokens(EPS[1].key) == 64.0


def test_block_size_from_the_scraped_metric() -> None:
    s = scorer()
    eps = [with_cache_geometry(EPS[0], block_size=32), EPS[1]]
    # the server with 32-token blocks stored 2 blocks of 32; keys of 16-token blocks would not match them
    s.index.apply(eps[0].key, MODEL, [BlockStored((1, 2), None, TOKENS, 32)])
    store(s, eps[1], TOKENS[:16])
    got = by_key(s.score(request(token_ids=TOKENS), eps, CycleState()))
    assert got == {eps[0].key: 1.0, eps[1].key: 0.25}
    fixed = scorer(autoTune=False)
    fixed.index.apply(eps[0].key, MODEL, [BlockStored((1, 2), None, TOKENS, 32)])
    assert by_key(fixed.score(request(token_ids=TOKENS), eps, CycleState()))[eps[0].key] == 0.0


def test_lora_requests_match_adapter_blocks_only() -> None:
    s = scorer()
    s.index.apply(EPS[0].key, MODEL, [BlockStored((1, 2), None, TOKENS[:32], 16, "ad")])
    assert by_key(s.score(request(token_ids=TOKENS, target_model="ad"), EPS, CycleState()))[EPS[0].key] == 0.5
    assert by_key(s.score(request(token_ids=TOKENS), EPS, CycleState()))[EPS[0].key] == 0.0


def test_speculative_entries_until_ttl() -> None:
    s = precise_prefix.PrecisePrefixCacheScorer(
        "p", precise_prefix.Params.model_validate({"speculativeIndexing": True, "speculativeTTL": "500ms"}), ctx()
    )
    clock = s._ctx.clock
    assert isinstance(clock, FakeClock)
    req = request(token_ids=TOKENS)
    s.pre_request(req, result(EPS[2]))
    assert by_key(s.score(req, EPS, CycleState()))[EPS[2].key] == 1.0
    clock.advance(0.6)
    assert by_key(s.score(req, EPS, CycleState()))[EPS[2].key] == 0.0


def test_without_tokens_it_fails_open_to_the_approximate_index() -> None:
    s = scorer()
    before = kvmetrics.SCORE_SOURCES.labels("precise", "approximate")._value.get()
    text = "the same long prompt text " * 20
    s.pre_request(request(prompt=text), result(EPS[1]))  # learned by the fallback on every pick
    got = by_key(s.score(request(prompt=text), EPS, CycleState()))
    assert got[EPS[1].key] == 1.0
    assert kvmetrics.SCORE_SOURCES.labels("precise", "approximate")._value.get() == before + 1
    off = scorer(fallback="none")
    off.pre_request(request(prompt=text), result(EPS[1]))
    assert set(by_key(off.score(request(prompt=text), EPS, CycleState())).values()) == {0.0}


def test_endpoint_leaving_drops_its_blocks() -> None:
    s = scorer()
    store(s, EPS[0], TOKENS)
    s.endpoints_changed(frozenset({EPS[1].key}))
    assert by_key(s.score(request(token_ids=TOKENS), EPS, CycleState()))[EPS[0].key] == 0.0
    assert s.index.entries == 0


def test_reference_parameters_validate() -> None:
    params = precise_prefix.Params.model_validate(
        {
            "tokenProcessorConfig": {"blockSizeTokens": 64, "hashSeed": 42},
            "kvEventsConfig": {"topicFilter": "kv@", "concurrency": 8, "podDiscoveryConfig": {"socketPort": 5556}},
            "indexerConfig": {
                "kvBlockIndexConfig": {"inMemoryConfig": {"size": 1000, "podCacheSize": 5}, "enableMetrics": True},
                "kvBlockScorerConfig": {
                    "backendConfigs": [{"name": "GPU", "weight": 1.0}, {"name": "cpu", "weight": 0.5}]
                },
                "tokenizersPoolConfig": {"modelName": "x"},
            },
        }
    )
    assert params.token_processor_config.tokens_per_block == 64
    assert params.token_processor_config.hash_seed == "42"
    assert params.kv_events_config.pod_discovery_config.socket_port == 5556
    s = precise_prefix.PrecisePrefixCacheScorer("p", params, ctx())
    assert s.index.max_blocks == 1000
    assert s.index.hash_seed == 42


@pytest.mark.parametrize(
    "bad",
    [
        "speculativeTTL: -1s",
        "kvEventsConfig: {discoverPods: false}",
        "indexerConfig: {kvBlockScorerConfig: {backendConfigs: []}}",
        "tokenProcessorConfig: {blockSize: 0}",
    ],
)
def test_bad_values_are_config_errors(bad: str) -> None:
    text = HEAD + f"plugins:\n- type: precise-prefix-cache-scorer\n  parameters: {{{bad}}}\n"
    with pytest.raises(errors.ConfigError):
        load_config(text, ctx())
