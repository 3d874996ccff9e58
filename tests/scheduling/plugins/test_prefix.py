"""prefix-cache-scorer and its index: reference hashing, match walk, learning on PreRequest, LRU, purge."""

from __future__ import annotations

import xxhash

from picker.endpoints.model import Endpoint
from picker.request.model import InferenceRequest
from picker.scheduling.framework import Category, CycleState, ProfileResult, SchedulingResult
from picker.scheduling.plugins import prefix
from picker.scheduling.plugins.prefix_index import PrefixIndex, prefix_hashes
from tests.conftest import endpoint, request
from tests.scheduling.helpers import by_key, ctx, with_cache_geometry

BLOCK = 64  # 16 tokens x 4 characters
EPS = [endpoint(1), endpoint(2), endpoint(3)]


def _scorer(**params: object) -> prefix.PrefixCacheScorer:
    scorer = prefix.create("prefix", prefix.Params.model_validate(params), ctx())
    assert isinstance(scorer, prefix.PrefixCacheScorer)
    return scorer


def _result(target: Endpoint, cycle: CycleState | None = None, **profiles: Endpoint) -> SchedulingResult:
    results: dict[str, ProfileResult | None] = {"default": ProfileResult((target,))}
    results.update({name: ProfileResult((ep,)) for name, ep in profiles.items()})
    return SchedulingResult(targets=(target,), primary_profile="default", runs=(), profile_results=results, cycle=cycle)


def _learn(scorer: prefix.PrefixCacheScorer, req: InferenceRequest, target: Endpoint) -> None:
    scorer.pre_request(req, _result(target))


# -- hashing ------------------------------------------------------------------------------------------------


def test_hashes_follow_the_reference_chain() -> None:
    text = "a" * BLOCK + "b" * 10  # one full block and a partial tail
    h0 = xxhash.xxh64_intdigest(b"model-x")
    h1 = xxhash.xxh64_intdigest(b"a" * BLOCK + h0.to_bytes(8, "little"))
    h2 = xxhash.xxh64_intdigest(b"b" * 10 + h1.to_bytes(8, "little"))
    assert prefix_hashes(text, BLOCK, 256, "model-x") == (h1, h2)


def test_cache_salt_joins_the_model_in_h0() -> None:
    text = "a" * BLOCK
    assert prefix_hashes(text, BLOCK, 256, "m", "salt") == prefix_hashes(text, BLOCK, 256, "msalt")
    assert prefix_hashes(text, BLOCK, 256, "m", "salt") != prefix_hashes(text, BLOCK, 256, "m")


def test_shorter_than_one_block_has_no_hashes() -> None:
    assert prefix_hashes("a" * (BLOCK - 1), BLOCK, 256, "m") == ()


def test_truncated_to_max_blocks() -> None:
    long = prefix_hashes("x" * (BLOCK * 10), BLOCK, 4, "m")
    assert len(long) == 4
    assert long == prefix_hashes("x" * (BLOCK * 4), BLOCK, 256, "m")


def test_hashes_depend_on_the_model_and_the_whole_prefix() -> None:
    a = prefix_hashes("p" * BLOCK + "q" * BLOCK, BLOCK, 256, "m")
    b = prefix_hashes("r" * BLOCK + "q" * BLOCK, BLOCK, 256, "m")
    assert a[1] != b[1]  # same second block, different prefix
    assert prefix_hashes("p" * BLOCK, BLOCK, 256, "other")[0] != a[0]


# -- scoring and learning -----------------------------------------------------------------------------------


def test_unknown_prompt_scores_zero_and_short_prompts_score_zero() -> None:
    scorer = _scorer()
    assert set(by_key(scorer.score(request(prompt="z" * 300), EPS, CycleState())).values()) == {0.0}
    assert set(by_key(scorer.score(request(prompt="hi"), EPS, CycleState())).values()) == {0.0}
    assert scorer.category is Category.AFFINITY
    assert scorer.type == "prefix-cache-scorer"


def test_learned_prefix_scores_matched_over_total() -> None:
    scorer = _scorer()
    shared = "s" * (BLOCK * 3)
    _learn(scorer, request(prompt=shared), EPS[1])
    # 3 shared blocks + 1 new full block: 3 of 4 match on .2
    scores = by_key(scorer.score(request(prompt=shared + "n" * BLOCK), EPS, CycleState()))
    assert scores == {EPS[0].key: 0.0, EPS[1].key: 0.75, EPS[2].key: 0.0}


def test_partial_tail_counts_in_the_total() -> None:
    scorer = _scorer()
    _learn(scorer, request(prompt="s" * BLOCK), EPS[0])
    scores = by_key(scorer.score(request(prompt="s" * BLOCK + "t"), EPS, CycleState()))
    assert scores[EPS[0].key] == 0.5


def test_different_target_model_does_not_match() -> None:
    scorer = _scorer()
    _learn(scorer, request(prompt="s" * 200, target_model="a"), EPS[0])
    assert by_key(scorer.score(request(prompt="s" * 200, target_model="b"), EPS, CycleState()))[EPS[0].key] == 0.0


def test_walk_stops_at_the_first_block_nobody_holds() -> None:
    index = PrefixIndex(100)
    index.add("a", [1, 2, 3])
    index.add("b", [1])
    index.add("c", [3, 4])
    # Every endpoint holding a walked block counts it (c: block 3); nobody holds 5, so 4 is never reached.
    assert index.match([1, 2, 3, 5, 4]) == {"a": 3, "b": 1, "c": 1}
    assert index.match([9, 1]) == {}


def test_pre_request_reuses_the_cycle_hashes() -> None:
    scorer = _scorer()
    req = request(prompt="s" * 300)
    cycle = CycleState()
    scorer.score(req, EPS, cycle)
    scorer.pre_request(req, _result(EPS[2], cycle))
    assert scorer.index.endpoint_blocks(EPS[2].key) == 5  # 300 chars = 4 blocks + tail
    assert by_key(scorer.score(req, EPS, CycleState()))[EPS[2].key] == 1.0


def test_prefill_profile_target_learns_too() -> None:
    scorer = _scorer()
    req = request(prompt="s" * 300)
    scorer.pre_request(req, _result(EPS[0], prefill=EPS[1]))
    scores = by_key(scorer.score(req, EPS, CycleState()))
    assert scores == {EPS[0].key: 1.0, EPS[1].key: 1.0, EPS[2].key: 0.0}


def test_lru_capacity_per_endpoint() -> None:
    scorer = _scorer(lruCapacityPerServer=4)
    old, new = request(prompt="o" * (BLOCK * 4)), request(prompt="n" * (BLOCK * 4))
    _learn(scorer, old, EPS[0])
    _learn(scorer, new, EPS[0])
    assert scorer.index.endpoint_blocks(EPS[0].key) == 4
    assert by_key(scorer.score(new, EPS, CycleState()))[EPS[0].key] == 1.0
    assert by_key(scorer.score(old, EPS, CycleState()))[EPS[0].key] == 0.0
    assert scorer.index.size == 4


def test_eviction_keeps_a_prefix_first_blocks_longest() -> None:
    index = PrefixIndex(3)
    index.add("a", [1, 2, 3, 4, 5])  # over capacity: the tail of the prefix goes, its root stays
    assert index.match([1, 2, 3, 4, 5]) == {"a": 3}


def test_auto_tune_block_size_and_capacity_from_metrics() -> None:
    scorer = _scorer()
    eps = [with_cache_geometry(e, block_size=4, num_gpu_blocks=2) for e in EPS]  # 16-char blocks
    req = request(prompt="k" * 64)  # 4 blocks of 16 chars
    scorer.pre_request(req, _result(eps[0]))
    assert scorer.index.endpoint_blocks(eps[0].key) == 2  # num_gpu_blocks bounds the LRU
    assert by_key(scorer.score(req, eps, CycleState()))[eps[0].key] == 0.5


def test_auto_tune_off_uses_configured_block_size() -> None:
    scorer = _scorer(autoTune=False, blockSizeTokens=8)  # 32-char blocks
    eps = [with_cache_geometry(e, block_size=4) for e in EPS]
    req = request(prompt="k" * 64)
    scorer.pre_request(req, _result(eps[0]))
    assert scorer.index.endpoint_blocks(eps[0].key) == 2


def test_deprecated_block_size_in_characters() -> None:
    scorer = _scorer(blockSize=32, autoTune=False)
    req = request(prompt="k" * 64)
    scorer.pre_request(req, _result(EPS[0]))
    assert scorer.index.endpoint_blocks(EPS[0].key) == 2


def test_max_prefix_tokens_overrides_blocks() -> None:
    scorer = _scorer(maxPrefixTokensToMatch=32)  # 2 blocks of 16 tokens
    req = request(prompt="k" * 1000)
    scorer.pre_request(req, _result(EPS[0]))
    assert scorer.index.endpoint_blocks(EPS[0].key) == 2


def test_endpoints_that_leave_are_purged() -> None:
    scorer = _scorer()
    req = request(prompt="s" * 300)
    _learn(scorer, req, EPS[0])
    _learn(scorer, req, EPS[1])
    scorer.endpoints_changed(frozenset({EPS[1].key}))
    assert scorer.index.endpoint_blocks(EPS[0].key) == 0
    assert by_key(scorer.score(req, EPS, CycleState())) == {EPS[0].key: 0.0, EPS[1].key: 1.0, EPS[2].key: 0.0}
    scorer.endpoints_changed(frozenset())
    assert scorer.index.size == 0
