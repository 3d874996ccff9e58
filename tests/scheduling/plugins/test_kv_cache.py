"""kv-cache-utilization-scorer: 1 - kv."""

from __future__ import annotations

import pytest

from picker.scheduling.framework import Category, CycleState
from picker.scheduling.plugins import kv_cache
from tests.conftest import endpoint, request
from tests.scheduling.helpers import by_key, ctx


@pytest.mark.parametrize(
    ("kv", "expected"),
    [((0.2, 0.1, 0.2), (0.8, 0.9, 0.8)), ((0.0, 1.0), (1.0, 0.0)), ((0.85,), (0.15,))],
)
def test_scores(kv: tuple[float, ...], expected: tuple[float, ...]) -> None:
    eps = [endpoint(i + 1, kv=k) for i, k in enumerate(kv)]
    scorer = kv_cache.create("kv", kv_cache.Params(), ctx())
    assert by_key(scorer.score(request(), eps, CycleState())) == {e.key: x for e, x in zip(eps, expected, strict=True)}
    assert scorer.type == "kv-cache-utilization-scorer"
    assert scorer.category is Category.DISTRIBUTION


def test_out_of_range_usage_is_left_to_the_profile_to_clamp() -> None:
    eps = [endpoint(1, kv=1.5), endpoint(2, kv=-0.5)]
    scores = by_key(kv_cache.create("kv", kv_cache.Params(), ctx()).score(request(), eps, CycleState()))
    assert scores == {eps[0].key: -0.5, eps[1].key: 1.5}
