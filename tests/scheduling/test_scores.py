"""ScoreVector: positional scores that still behave as the Mapping[Endpoint, float] the protocol names."""

from __future__ import annotations

import dataclasses

import pytest

from picker.scheduling.framework import CycleState
from picker.scheduling.plugins import max_score
from picker.scheduling.profile import Profile, WeightedScorer
from picker.scheduling.scores import ScoreVector
from tests.conftest import endpoint, request
from tests.scheduling.helpers import ctx

EPS = (endpoint(1), endpoint(2), endpoint(3))


def test_mapping_behaviour() -> None:
    vec = ScoreVector(EPS, [0.1, 0.2, 0.3])
    assert len(vec) == 3
    assert list(vec) == list(EPS)
    assert vec[EPS[1]] == 0.2
    # Endpoints are equal by key: a re-published copy (new metrics) finds its score.
    assert vec[dataclasses.replace(EPS[2], excluded=True)] == 0.3
    assert vec.get(endpoint(9), -1.0) == -1.0
    assert EPS[0] in vec
    assert endpoint(9) not in vec
    assert "x" not in vec
    assert dict(vec) == {EPS[0]: 0.1, EPS[1]: 0.2, EPS[2]: 0.3}
    assert vec.as_dict() == {e.key: s for e, s in zip(EPS, [0.1, 0.2, 0.3], strict=True)}
    with pytest.raises(KeyError):
        vec[endpoint(9)]


def test_length_mismatch_is_an_error() -> None:
    with pytest.raises(ValueError, match="2 scores for 3 endpoints"):
        ScoreVector(EPS, [1.0, 2.0])


class _Reordered:
    """A scorer whose ScoreVector covers the endpoints in another order: the profile must look scores up."""

    type = "reordered"
    category = None
    name = "reordered"

    def score(self, req: object, endpoints: object, cycle: object) -> ScoreVector:
        rev = tuple(reversed(EPS))
        return ScoreVector(rev, [1.0, 0.5, 0.0])  # .3 -> 1.0, .2 -> 0.5, .1 -> 0.0


def test_profile_reads_a_foreign_vector_by_key() -> None:
    c = ctx()
    profile = Profile("p", [], [WeightedScorer(_Reordered(), 1.0)], max_score.create("m", max_score.Params(), c))  # type: ignore[list-item]
    outcome = profile.run(request(), list(EPS), CycleState(), [])
    assert outcome.run.scores["reordered"] == {EPS[0].key: 0.0, EPS[1].key: 0.5, EPS[2].key: 1.0}
    assert outcome.run.result is not None
    assert outcome.run.result.targets == (EPS[2],)
