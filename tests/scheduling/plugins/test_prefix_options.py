"""prefix-cache-scorer's picker options (scoreMode tokens, charsPerToken, cold spreading), the
match it leaves in the cycle, and the lmetric-scorer built on its index."""

from __future__ import annotations

import pytest

from picker.endpoints.model import Endpoint
from picker.plugins import Category, CycleState, ProfileResult, ResponseInfo, SchedulingResult
from picker.request.model import InferenceRequest
from picker.scheduling.plugins import lmetric, prefix
from picker.scheduling.plugins.prefix import MATCH_STATE, PrefixMatch, match_key
from tests.conftest import endpoint, request
from tests.scheduling.helpers import by_key, ctx

BLOCK = 64
EPS = [endpoint(1), endpoint(2), endpoint(3)]
E1, E2, E3 = (e.key for e in EPS)


def _scorer(c: object = None, **params: object) -> prefix.PrefixCacheScorer:
    scorer = prefix.create("prefix", prefix.Params.model_validate(params), c or ctx())  # type: ignore[arg-type]
    assert isinstance(scorer, prefix.PrefixCacheScorer)
    return scorer


def _learn(scorer: prefix.PrefixCacheScorer, req: InferenceRequest, target: Endpoint) -> None:
    results: dict[str, ProfileResult | None] = {"default": ProfileResult((target,))}
    scorer.pre_request(req, SchedulingResult((target,), "default", (), results))


def test_defaults_keep_the_reference_behaviour() -> None:
    params = prefix.Params()
    assert (params.score_mode, params.cold_spread, params.chars_per_token) == ("ratio", 0.0, 4.0)


def test_tokens_mode_scores_absolute_matched_tokens() -> None:
    ratio, tokens = _scorer(), _scorer(scoreMode="tokens", saturationTokens=96)
    shared = "s" * (BLOCK * 3)
    req = request(prompt=shared + "n" * BLOCK)  # 256 chars ⇒ 64 tokens; 3 of 4 blocks held by E2
    for scorer in (ratio, tokens):
        _learn(scorer, request(prompt=shared), EPS[1])
    assert by_key(ratio.score(req, EPS, CycleState()))[E2] == 0.75
    assert by_key(tokens.score(req, EPS, CycleState()))[E2] == 0.5  # 48 matched tokens / 96


def test_tokens_mode_does_not_overrate_a_short_whole_match() -> None:
    ratio, tokens = _scorer(), _scorer(scoreMode="tokens")
    short = request(prompt="s" * BLOCK)  # 16 tokens, all of it cached on E1
    for scorer in (ratio, tokens):
        _learn(scorer, short, EPS[0])
    assert by_key(ratio.score(short, EPS, CycleState()))[E1] == 1.0
    assert by_key(tokens.score(short, EPS, CycleState()))[E1] == pytest.approx(16 / 2048)


def test_tokens_mode_calibrates_characters_per_token_from_usage() -> None:
    scorer = _scorer(scoreMode="tokens", saturationTokens=48)
    shared = "s" * (BLOCK * 3)
    req = request(prompt=shared + "n" * BLOCK)
    _learn(scorer, request(prompt=shared), EPS[1])
    scorer.post_response(req, ResponseInfo(endpoint_key=E2, prompt_tokens=32))  # 256 chars / 32 tokens = 8
    assert scorer.tokens.chars_per_token(req.target_model) == 8.0
    assert by_key(scorer.score(req, EPS, CycleState()))[E2] == 0.5  # 24 of 32 tokens matched / 48


def test_ratio_mode_does_not_calibrate() -> None:
    scorer = _scorer()
    scorer.post_response(request(prompt="x" * 100), ResponseInfo(endpoint_key=E1, prompt_tokens=10))
    assert scorer.tokens.chars_per_token("my-model") == 4.0


def test_chars_per_token_sets_the_block_size() -> None:
    scorer = _scorer(charsPerToken=2.0, autoTune=False)  # 16 tokens x 2 = 32-character blocks
    _learn(scorer, request(prompt="k" * 64), EPS[0])
    assert scorer.index.endpoint_blocks(E1) == 2


def test_match_state_is_left_in_the_cycle() -> None:
    scorer = _scorer()
    req = request(prompt="s" * (BLOCK * 2))
    _learn(scorer, req, EPS[2])
    cycle = CycleState()
    scorer.score(req, EPS, cycle)
    match = cycle[match_key("prefix")]
    assert cycle[MATCH_STATE] is match
    assert isinstance(match, PrefixMatch)
    assert (match.blocks, match.total_blocks, match.block_chars, match.prompt_chars) == ({E3: 2}, 2, BLOCK, 128)
    assert not match.cold
    assert match.matched_fraction(E3) == 1.0
    assert match.uncached_tokens(E1) == match.prompt_tokens == 32


def test_cold_spread_prefers_the_endpoint_with_the_least_cached() -> None:
    scorer = _scorer(coldSpread=0.5)
    _learn(scorer, request(prompt="a" * (BLOCK * 4)), EPS[0])
    _learn(scorer, request(prompt="b" * (BLOCK * 2)), EPS[1])
    cold = request(prompt="c" * (BLOCK * 2))
    assert by_key(scorer.score(cold, EPS, CycleState())) == {E1: 0.0, E2: 0.25, E3: 0.5}
    fresh = _scorer(coldSpread=0.5)
    assert set(by_key(fresh.score(cold, EPS, CycleState())).values()) == {0.5}
    assert set(by_key(fresh.score(request(prompt="hi"), EPS, CycleState())).values()) == {0.0}  # < one block


def _lmetric(c: object = None, **params: object) -> lmetric.LMetricScorer:
    scorer = lmetric.create("lm", lmetric.Params.model_validate(params), c or ctx())  # type: ignore[arg-type]
    assert isinstance(scorer, lmetric.LMetricScorer)
    return scorer


def test_lmetric_cost_is_uncached_tokens_times_batch_plus_one() -> None:
    c = ctx()
    scorer = _lmetric(c)
    req = request(prompt="s" * (BLOCK * 4))  # 64 tokens
    _learn(scorer, request(prompt="s" * (BLOCK * 3)), EPS[1])  # E2 holds 48 of them
    for _ in range(3):
        c.inflight.acquire(E2, 1, 0.0)
    eps = [EPS[0], EPS[1], endpoint(3, running=1, waiting=1)]
    assert scorer.costs(req, eps, CycleState()) == [64.0, 16.0 * 4, 64.0 * 3]
    assert by_key(scorer.score(req, eps, CycleState())) == {E1: pytest.approx(2 / 3), E2: pytest.approx(2 / 3), E3: 0.0}
    assert scorer.category is Category.BALANCE


def test_lmetric_full_hit_costs_at_least_one_token_and_equal_costs_score_one() -> None:
    scorer = _lmetric()
    req = request(prompt="s" * (BLOCK * 2))
    _learn(scorer, req, EPS[0])
    assert scorer.costs(req, EPS, CycleState())[0] == 1.0
    assert set(by_key(scorer.score(request(prompt="zz"), EPS, CycleState())).values()) == {1.0}


@pytest.mark.parametrize(("source", "batch"), [("inflight", 2), ("scraped", 5), ("max", 5)])
def test_lmetric_load_source(source: str, batch: int) -> None:
    c = ctx()
    for _ in range(2):
        c.inflight.acquire(E1, 1, 0.0)
    scorer = _lmetric(c, loadSource=source)
    ep = endpoint(1, running=3, waiting=2)
    assert scorer.costs(request(prompt="x" * 40), [ep], CycleState()) == [10.0 * (batch + 1)]


def test_lmetric_learns_and_calibrates_like_the_prefix_scorer() -> None:
    scorer = _lmetric()
    req = request(prompt="s" * (BLOCK * 2))
    scorer.post_response(req, ResponseInfo(endpoint_key=E1, prompt_tokens=64))  # 2 chars per token
    assert scorer.tokens.prompt_tokens(req) == 64.0
    cycle = CycleState()
    scorer.score(req, EPS, cycle)
    assert isinstance(cycle[match_key("lm")], PrefixMatch)


def test_a_match_only_on_a_non_candidate_is_cold() -> None:
    scorer = _scorer(coldSpread=0.5)
    req = request(prompt="s" * 300)
    _learn(scorer, req, EPS[2])
    cycle = CycleState()
    scores = by_key(scorer.score(req, EPS[:2], cycle))
    assert cycle[MATCH_STATE].cold
    assert scores == {E1: 0.5, E2: 0.5}
