"""max-score-picker, random-picker, weighted-random-picker: choice, fallbacks, random tie-break."""

from __future__ import annotations

import collections

import pytest

from picker.endpoints.model import Endpoint
from picker.scheduling.framework import CycleState, Picker, ScoredEndpoint
from picker.scheduling.plugins import max_score, random_picker, weighted_random
from tests.conftest import endpoint
from tests.scheduling.helpers import ctx, ids

EPS = [endpoint(i) for i in range(1, 6)]


def _scored(*scores: float) -> list[ScoredEndpoint]:
    return [ScoredEndpoint(e, s) for e, s in zip(EPS, scores, strict=False)]


def _counts(picker: Picker, scored: list[ScoredEndpoint], n: int = 2000) -> collections.Counter[int]:
    counter: collections.Counter[int] = collections.Counter()
    for _ in range(n):
        counter[ids(picker.pick(scored, CycleState()).targets)[0]] += 1
    return counter


def test_max_score_takes_the_best() -> None:
    picker = max_score.create("p", max_score.Params(), ctx())
    assert ids(picker.pick(_scored(0.1, 2.5, 0.3), CycleState()).targets) == [2]


def test_max_score_fallbacks_in_score_order() -> None:
    picker = max_score.create("p", max_score.Params(max_num_of_endpoints=3), ctx())
    assert ids(picker.pick(_scored(0.1, 2.5, 0.3, 1.0), CycleState()).targets) == [2, 4, 3]


def test_max_score_more_requested_than_candidates() -> None:
    picker = max_score.create("p", max_score.Params.model_validate({"maxNumOfEndpoints": 10}), ctx())
    assert sorted(ids(picker.pick(_scored(1, 2), CycleState()).targets)) == [1, 2]


def test_max_score_ties_are_broken_uniformly() -> None:
    picker = max_score.create("p", max_score.Params(), ctx(seed=3))
    counts = _counts(picker, _scored(1.0, 1.0, 0.5, 1.0))
    assert set(counts) == {1, 2, 4}
    assert min(counts.values()) > 500  # each of three ties near 2000/3


def test_max_score_ties_in_fallback_order_are_random_too() -> None:
    picker = max_score.create("p", max_score.Params(max_num_of_endpoints=2), ctx(seed=5))
    seconds = collections.Counter(ids(picker.pick(_scored(2, 1, 1, 1), CycleState()).targets)[1] for _ in range(900))
    assert set(seconds) == {2, 3, 4}


def test_seeded_pickers_repeat() -> None:
    a = max_score.create("p", max_score.Params(), ctx(seed=11))
    b = max_score.create("p", max_score.Params(), ctx(seed=11))
    scored = _scored(1, 1, 1, 1, 1)
    assert [a.pick(scored, CycleState()).targets for _ in range(20)] == [
        b.pick(scored, CycleState()).targets for _ in range(20)
    ]


def test_empty_input_picks_nothing() -> None:
    for picker in (
        max_score.create("p", max_score.Params(), ctx()),
        random_picker.create("p", random_picker.Params(), ctx()),
        weighted_random.create("p", weighted_random.Params(), ctx()),
    ):
        assert picker.pick([], CycleState()).targets == ()


def test_random_picker_ignores_scores() -> None:
    picker = random_picker.create("p", random_picker.Params(), ctx(seed=1))
    counts = _counts(picker, _scored(100, 0, 0, 0, 0))
    assert set(counts) == {1, 2, 3, 4, 5}


def test_random_picker_distinct_fallbacks() -> None:
    picker = random_picker.create("p", random_picker.Params(max_num_of_endpoints=3), ctx())
    targets = picker.pick(_scored(1, 1, 1, 1, 1), CycleState()).targets
    assert len(set(targets)) == 3


def test_weighted_random_follows_the_weights() -> None:
    picker = weighted_random.create("p", weighted_random.Params(), ctx(seed=2))
    counts = _counts(picker, _scored(3.0, 1.0, 0.0), n=4000)
    assert counts[3] == 0  # zero weight is never first while a positive one exists
    assert 0.70 < counts[1] / 4000 < 0.80  # expected 0.75


def test_weighted_random_all_zero_is_uniform() -> None:
    picker = weighted_random.create("p", weighted_random.Params(), ctx(seed=4))
    counts = _counts(picker, _scored(0, 0, 0))
    assert set(counts) == {1, 2, 3}
    assert min(counts.values()) > 500


def test_weighted_random_zero_weights_only_as_last_fallbacks() -> None:
    picker = weighted_random.create("p", weighted_random.Params(max_num_of_endpoints=3), ctx())
    for _ in range(50):
        assert ids(picker.pick(_scored(0, 1, 0), CycleState()).targets)[0] == 2


@pytest.mark.parametrize("module", [max_score, random_picker, weighted_random])
def test_bad_count_is_rejected(module: object) -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError):
        module.Params.model_validate({"maxNumOfEndpoints": 0})  # type: ignore[attr-defined]


def test_ranked_and_scored_paths_agree() -> None:
    scored = _scored(0.5, 0.9, 0.1, 0.9)
    eps: list[Endpoint] = [s.endpoint for s in scored]
    totals = [s.score for s in scored]
    for module in (max_score, random_picker, weighted_random):
        a = module.create("p", module.Params(max_num_of_endpoints=2), ctx(seed=9))  # type: ignore[attr-defined]
        b = module.create("p", module.Params(max_num_of_endpoints=2), ctx(seed=9))  # type: ignore[attr-defined]
        assert a.pick(scored, CycleState()) == b.pick_ranked(eps, totals, CycleState())
