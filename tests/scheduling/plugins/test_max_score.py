"""max-score-picker's tieBreak and tieTolerance (picker's options); the reference behaviour is in test_pickers."""

from __future__ import annotations

import collections

import pytest
from pydantic import ValidationError

from picker.scheduling.framework import ROTATE_TIES, CycleState, ScoredEndpoint
from picker.scheduling.plugins import max_score
from tests.conftest import endpoint
from tests.scheduling.helpers import ctx, ids

EPS = [endpoint(i) for i in range(1, 6)]


def _picker(**params: object) -> max_score.MaxScorePicker:
    picker = max_score.create("p", max_score.Params.model_validate(params), ctx(seed=1))
    assert isinstance(picker, max_score.MaxScorePicker)
    return picker


def _first(picker: max_score.MaxScorePicker, *scores: float, rotate: bool = False) -> int:
    scored = [ScoredEndpoint(e, s) for e, s in zip(EPS, scores, strict=False)]
    cycle = CycleState()
    if rotate:
        cycle[ROTATE_TIES] = True
    return ids(picker.pick(scored, cycle).targets)[0]


def test_defaults_are_the_reference_random_exact_ties() -> None:
    params = max_score.Params()
    assert (params.tie_break, params.tie_tolerance) == ("random", 0.0)


def test_round_robin_spreads_equal_requests_evenly() -> None:
    picker = _picker(tieBreak="roundRobin")
    picks = [_first(picker, 1, 1, 1, 1, 1) for _ in range(5 * 40)]
    assert picks[5:10] == picks[:5]  # a fixed rotation
    assert all(sorted(picks[i : i + 5]) == [1, 2, 3, 4, 5] for i in range(0, len(picks), 5))  # every round all


def test_random_tie_break_is_less_even_than_round_robin() -> None:
    picker = _picker()
    picks = [_first(picker, 1, 1, 1, 1, 1) for _ in range(200)]
    rounds = [sorted(picks[i : i + 5]) for i in range(0, 200, 5)]
    assert any(r != [1, 2, 3, 4, 5] for r in rounds)  # random choice repeats endpoints within a round


def test_round_robin_starts_in_a_random_order_per_picker() -> None:
    orders = set()
    for seed in range(6):
        picker = max_score.create("p", max_score.Params(tieBreak="roundRobin"), ctx(seed=seed))
        scored = [ScoredEndpoint(e, 1.0) for e in EPS]
        orders.add(tuple(ids(picker.pick(scored, CycleState()).targets)[0] for _ in range(5)))
    assert len(orders) > 1  # replicas do not all start on the same endpoint


def test_round_robin_skips_the_endpoint_a_higher_score_just_took() -> None:
    picker = _picker(tieBreak="roundRobin")
    assert _first(picker, 1, 1, 2, 1, 1) == 3  # a cache hit, say
    rotation = [_first(picker, 1, 1, 1, 1, 1) for _ in range(5)]
    assert rotation[-1] == 3  # 3 was chosen last: it waits behind every other tied endpoint
    assert sorted(rotation) == [1, 2, 3, 4, 5]


def test_round_robin_never_prefers_a_lower_score() -> None:
    picker = _picker(tieBreak="roundRobin")
    assert {_first(picker, 1, 1, 0.5, 1, 1) for _ in range(40)} == {1, 2, 4, 5}


def test_a_flagged_request_rotates_among_the_flagged_ones_with_random_ties() -> None:
    picker = _picker()  # random ties
    picks = []
    for _ in range(40):
        picks.append(_first(picker, 1, 1, 1, 1, 1, rotate=True))
        _first(picker, 1, 1, 1, 1, 1)  # an unflagged pick between each: random, and not part of the rotation
    assert all(sorted(picks[i : i + 5]) == [1, 2, 3, 4, 5] for i in range(0, len(picks), 5))
    assert {_first(picker, 1, 1, 0.5, 1, 1, rotate=True) for _ in range(20)} == {1, 2, 4, 5}  # ties only
    fallbacks = max_score.create("p", max_score.Params(maxNumOfEndpoints=3), ctx(seed=1))
    cycle = CycleState({ROTATE_TIES: True})
    firsts = [ids(fallbacks.pick([ScoredEndpoint(e, 1.0) for e in EPS], cycle).targets)[0] for _ in range(10)]
    assert sorted(firsts) == [1, 1, 2, 2, 3, 3, 4, 4, 5, 5]


def test_tolerance_makes_near_ties_equal_and_no_more() -> None:
    picker = _picker(tieBreak="roundRobin", tieTolerance=0.05)
    scores = (3.00, 2.96, 2.90, 2.951, 3.04)  # within 0.05 of 3.04: 1, 5; of the others none
    assert collections.Counter(_first(picker, *scores) for _ in range(40)) == {5: 20, 1: 20}
    exact = _picker(tieBreak="roundRobin")
    assert {_first(exact, *scores) for _ in range(10)} == {5}


def test_tolerance_with_random_tie_break_draws_within_the_band() -> None:
    picker = _picker(tieTolerance=0.1)
    counts = collections.Counter(_first(picker, 1.0, 0.95, 0.5, 0.91, 0.0) for _ in range(900))
    assert set(counts) == {1, 2, 4}
    assert min(counts.values()) > 200


def test_fallbacks_rank_the_band_as_the_best_then_by_score() -> None:
    picker = _picker(tieBreak="roundRobin", tieTolerance=0.1, maxNumOfEndpoints=4)
    scored = [ScoredEndpoint(e, s) for e, s in zip(EPS, (0.5, 1.0, 0.95, 0.2, 0.7), strict=True)]
    first = ids(picker.pick(scored, CycleState()).targets)
    second = ids(picker.pick(scored, CycleState()).targets)
    assert sorted(first[:2]) == [2, 3]
    assert first[2:] == second[2:] == [5, 1]  # the rest by score
    assert second[:2] == first[1::-1]  # the band {2, 3} rotates


def test_round_robin_forgets_endpoints_that_left() -> None:
    picker = _picker(tieBreak="roundRobin")
    for i in range(200):  # endpoints come and go: the memory stays bounded
        scored = [ScoredEndpoint(endpoint(i % 250 + 1), 1.0), ScoredEndpoint(EPS[0], 1.0)]
        picker.pick(scored, CycleState())
    assert len(picker._last_chosen) <= 2 * 2 + 64 + 1


def test_tie_parameters_are_validated() -> None:
    with pytest.raises(ValidationError):
        max_score.Params.model_validate({"tieBreak": "first"})
    with pytest.raises(ValidationError):
        max_score.Params.model_validate({"tieTolerance": -0.1})
