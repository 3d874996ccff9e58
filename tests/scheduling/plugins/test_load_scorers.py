"""token-load-scorer, load-aware-scorer, active-request-scorer: the reference formulas and their edges."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from picker.plugins import Category, CycleState
from picker.scheduling.plugins import active_request, load_aware, token_load
from picker.scheduling.plugins.prefix import MATCH_STATE, PrefixMatch
from tests.conftest import endpoint, request
from tests.scheduling.helpers import by_key, ctx

E1, E2, E3 = endpoint(1), endpoint(2), endpoint(3)


# -- token-load-scorer ----------------------------------------------------------------------------------------


def test_token_load_is_one_minus_inflight_over_threshold() -> None:
    c = ctx()
    c.inflight.acquire(E1.key, 100, 0.0)
    c.inflight.acquire(E2.key, 1000, 0.0)
    scorer = token_load.create("t", token_load.Params(queueThresholdTokens=1000), c)
    req = request(prompt="", prompt_tokens=0)
    assert by_key(scorer.score(req, [E1, E2, E3], CycleState())) == {E1.key: 0.9, E2.key: 0.0, E3.key: 1.0}
    assert scorer.category is Category.DISTRIBUTION


def test_token_load_caps_at_the_threshold_and_counts_this_request() -> None:
    c = ctx()
    c.inflight.acquire(E1.key, 5000, 0.0)
    scorer = token_load.create("t", token_load.Params(queueThresholdTokens=1000), c)
    scores = by_key(scorer.score(request(prompt_tokens=100), [E1, E2], CycleState()))
    assert scores == {E1.key: 0.0, E2.key: 0.9}  # E2: only this request's 100 tokens


def test_token_load_counts_only_uncached_prompt_tokens_where_a_prefix_matched() -> None:
    scorer = token_load.create("t", token_load.Params(queueThresholdTokens=1000), ctx())
    cycle = CycleState()
    cycle[MATCH_STATE] = PrefixMatch({E1.key: 3}, 4, 64, 256, 64.0)  # E1 holds 3/4 of the prompt
    scores = by_key(scorer.score(request(prompt_tokens=400), [E1, E2], cycle))
    assert scores == {E1.key: 0.9, E2.key: 0.6}


def test_token_load_default_threshold_and_validation() -> None:
    assert token_load.Params().queue_threshold_tokens == 4_194_304
    with pytest.raises(ValidationError):
        token_load.Params(queueThresholdTokens=0)
    assert token_load.Params.model_validate({"inFlightLoadProducerName": "x"}).in_flight_load_producer_name == "x"


# -- load-aware-scorer ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("waiting", "expected"),
    [(0, 0.5), (1, 0.5 * (1 - 1 / 128)), (64, 0.25), (128, 0.0), (500, 0.0)],
)
def test_load_aware_half_scale(waiting: int, expected: float) -> None:
    scorer = load_aware.create("l", load_aware.Params(), ctx())
    assert by_key(scorer.score(request(), [endpoint(1, waiting=waiting)], CycleState())) == {
        E1.key: pytest.approx(expected)
    }


def test_load_aware_threshold_parameter() -> None:
    scorer = load_aware.create("l", load_aware.Params(threshold=4), ctx())
    assert by_key(scorer.score(request(), [endpoint(1, waiting=2)], CycleState())) == {E1.key: 0.25}
    with pytest.raises(ValidationError):
        load_aware.Params(threshold=0)


# -- active-request-scorer -------------------------------------------------------------------------------------


def test_active_request_relative_to_the_busiest() -> None:
    c = ctx()
    for _ in range(4):
        c.inflight.acquire(E1.key, 1, 0.0)
    c.inflight.acquire(E2.key, 1, 0.0)
    scorer = active_request.create("a", active_request.Params(), c)
    assert by_key(scorer.score(request(), [E1, E2, E3], CycleState())) == {E1.key: 0.0, E2.key: 0.75, E3.key: 1.0}


def test_active_request_idle_threshold_and_max_busy_score() -> None:
    c = ctx()
    for _ in range(4):
        c.inflight.acquire(E1.key, 1, 0.0)
    for _ in range(2):
        c.inflight.acquire(E2.key, 1, 0.0)
    c.inflight.acquire(E3.key, 1, 0.0)
    scorer = active_request.create("a", active_request.Params(idleThreshold=1, maxBusyScore=0.5), c)
    # E3 (1 ≤ idle threshold) is idle; busy ones scale into [0, 0.5].
    assert by_key(scorer.score(request(), [E1, E2, E3], CycleState())) == {E1.key: 0.0, E2.key: 0.25, E3.key: 1.0}


def test_active_request_all_idle_and_released_leases() -> None:
    c = ctx()
    lease = c.inflight.acquire(E1.key, 1, 0.0)
    c.inflight.release(lease)
    scorer = active_request.create("a", active_request.Params(), c)
    assert set(by_key(scorer.score(request(), [E1, E2], CycleState())).values()) == {1.0}


def test_active_request_parameter_bounds() -> None:
    with pytest.raises(ValidationError):
        active_request.Params(maxBusyScore=1.5)
    with pytest.raises(ValidationError):
        active_request.Params(idleThreshold=-1)
    assert active_request.Params.model_validate({"requestTimeout": "2m"}).request_timeout == "2m"
