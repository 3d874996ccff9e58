"""queue-scorer and running-requests-size-scorer: min-max over the candidates; all equal ⇒ 1.0."""

from __future__ import annotations

import pytest

from picker.request.model import InferenceRequest
from picker.scheduling.framework import Category, CycleState
from picker.scheduling.plugins import queue, running
from tests.conftest import endpoint, request
from tests.scheduling.helpers import by_key, ctx

REQ: InferenceRequest = request()


@pytest.mark.parametrize(
    ("queues", "expected"),
    [
        ((3, 0, 10), (0.7, 1.0, 0.0)),
        ((5, 5, 5), (1.0, 1.0, 1.0)),
        ((0, 0, 0), (1.0, 1.0, 1.0)),
        ((7,), (1.0,)),
        ((0, 4), (1.0, 0.0)),
        ((2, 4, 6, 10), (1.0, 0.75, 0.5, 0.0)),
    ],
)
def test_queue_scores(queues: tuple[int, ...], expected: tuple[float, ...]) -> None:
    eps = [endpoint(i + 1, waiting=q) for i, q in enumerate(queues)]
    scorer = queue.create("q", queue.Params(), ctx())
    scores = by_key(scorer.score(REQ, eps, CycleState()))
    assert scores == {e.key: x for e, x in zip(eps, expected, strict=True)}


def test_queue_ignores_running() -> None:
    eps = [endpoint(1, waiting=1, running=50), endpoint(2, waiting=2, running=0)]
    scores = by_key(queue.create("q", queue.Params(), ctx()).score(REQ, eps, CycleState()))
    assert scores == {eps[0].key: 1.0, eps[1].key: 0.0}


@pytest.mark.parametrize(
    ("running_counts", "expected"),
    [((3, 0, 10), (0.7, 1.0, 0.0)), ((4, 4), (1.0, 1.0)), ((0, 8, 2), (1.0, 0.0, 0.75))],
)
def test_running_scores(running_counts: tuple[int, ...], expected: tuple[float, ...]) -> None:
    eps = [endpoint(i + 1, running=r, waiting=99 * i) for i, r in enumerate(running_counts)]
    scorer = running.create("r", running.Params(), ctx())
    scores = by_key(scorer.score(REQ, eps, CycleState()))
    assert scores == {e.key: x for e, x in zip(eps, expected, strict=True)}


def test_identity() -> None:
    q = queue.create("my-queue", queue.Params(), ctx())
    assert (q.type, q.name, q.category) == ("queue-scorer", "my-queue", Category.DISTRIBUTION)
    r = running.create("r", running.Params(), ctx())
    assert (r.type, r.category) == ("running-requests-size-scorer", Category.DISTRIBUTION)


def test_empty_candidates() -> None:
    assert len(queue.create("q", queue.Params(), ctx()).score(REQ, [], CycleState())) == 0
