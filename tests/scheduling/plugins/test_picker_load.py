"""picker-load-scorer: max(own in-flight tokens, scraped queue x tokens per request) + uncached prompt tokens."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from picker.plugins import Category, CycleState, ResponseInfo
from picker.scheduling.plugins import picker_load
from picker.scheduling.plugins.prefix import MATCH_STATE, PrefixMatch
from tests.conftest import endpoint, request
from tests.scheduling.helpers import by_key, ctx

E1, E2, E3 = endpoint(1), endpoint(2), endpoint(3)


def _scorer(c: object, **params: object) -> picker_load.PickerLoadScorer:
    scorer = picker_load.create("pl", picker_load.Params.model_validate(params), c)  # type: ignore[arg-type]
    assert isinstance(scorer, picker_load.PickerLoadScorer)
    return scorer


def test_proportional_to_the_busiest_endpoint() -> None:
    c = ctx()
    c.inflight.acquire(E1.key, 300, 0.0)
    c.inflight.acquire(E2.key, 100, 0.0)
    scorer = _scorer(c)
    req = request(prompt="x" * 400)  # 100 tokens
    # Work: E1 300 + 100, E2 100 + 100, E3 0 + 100.
    assert by_key(scorer.score(req, [E1, E2, E3], CycleState())) == {E1.key: 0.0, E2.key: 0.5, E3.key: 0.75}
    assert scorer.category is Category.DISTRIBUTION


def test_scraped_queue_counts_when_it_sees_more_than_picker() -> None:
    c = ctx()
    c.inflight.acquire(E1.key, 1000, 0.0)  # picker's mean request: 1000 tokens
    busy_elsewhere = endpoint(2, waiting=3)  # 3 waiting requests picker did not send ⇒ 3000 tokens
    scorer = _scorer(c)
    req = request(prompt="", prompt_tokens=0)
    assert by_key(scorer.score(req, [E1, busy_elsewhere, E3], CycleState())) == {
        E1.key: pytest.approx(2 / 3),
        E2.key: 0.0,
        E3.key: 1.0,
    }
    fixed = _scorer(c, tokensPerQueuedRequest=100)  # now the queue is only 300 tokens
    assert by_key(fixed.score(req, [E1, busy_elsewhere], CycleState())) == {E1.key: 0.0, E2.key: 0.7}


def test_default_tokens_per_queued_request_without_inflight() -> None:
    scorer = _scorer(ctx())
    req = request(prompt="", prompt_tokens=0)
    scores = by_key(scorer.score(req, [endpoint(1, waiting=1), endpoint(2, waiting=2)], CycleState()))
    assert scores == {E1.key: 0.5, E2.key: 0.0}  # 1024 vs 2048


def test_uncached_prompt_tokens_from_the_prefix_match() -> None:
    scorer = _scorer(ctx())
    cycle = CycleState()
    cycle[MATCH_STATE] = PrefixMatch({E1.key: 4}, 4, 64, 256, 64.0)
    req = request(prompt="s" * 256)  # 64 tokens: all cached on E1
    assert by_key(scorer.score(req, [E1, E2], cycle)) == {E1.key: 1.0, E2.key: 0.0}


def test_all_equal_scores_one_and_full_kv_scores_zero() -> None:
    scorer = _scorer(ctx())
    req = request()
    assert set(by_key(scorer.score(req, [E1, E2], CycleState())).values()) == {1.0}
    full = endpoint(2, kv=0.97)
    assert by_key(scorer.score(req, [E1, full], CycleState())) == {E1.key: 1.0, E2.key: 0.0}
    off = _scorer(ctx(), kvCacheUtilThreshold=1.0)
    assert by_key(off.score(req, [E1, full], CycleState()))[E2.key] == 1.0
    assert list(scorer.score(req, [], CycleState()).values()) == []


def test_calibrates_and_validates() -> None:
    scorer = _scorer(ctx())
    req = request(prompt="y" * 300)
    scorer.post_response(req, ResponseInfo(endpoint_key=E1.key, prompt_tokens=100))
    assert scorer.tokens.prompt_tokens(req) == 100.0
    with pytest.raises(ValidationError):
        picker_load.Params(kvCacheUtilThreshold=0.0)
    with pytest.raises(ValidationError):
        picker_load.Params(tokensPerQueuedRequest=-1)
