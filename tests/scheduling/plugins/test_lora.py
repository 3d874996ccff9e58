"""lora-affinity-scorer: active 1.0 > room for another adapter 0.8 > waiting 0.6 > 0."""

from __future__ import annotations

import pytest

from picker.scheduling.framework import Category, CycleState
from picker.scheduling.plugins import lora
from tests.conftest import endpoint, request
from tests.scheduling.helpers import ctx

ADAPTER = "sql-lora-1fdg2"


@pytest.mark.parametrize(
    ("running", "waiting", "max_loras", "expected"),
    [
        ((ADAPTER,), (), 1, 1.0),
        ((ADAPTER, "a", "b"), (), 2, 1.0),  # active beats a full server
        (("a",), (), 4, 0.8),
        ((), (), 1, 0.8),
        (("a",), (ADAPTER,), 4, 0.8),  # room beats waiting
        (("a",), (ADAPTER,), 2, 0.6),
        (("a", "b"), (), 2, 0.0),
        ((), (), 0, 0.0),  # no LoRA reported at all
        (("a",), ("a",), 2, 0.8),  # an adapter both running and waiting counts once
    ],
)
def test_scores(running: tuple[str, ...], waiting: tuple[str, ...], max_loras: int, expected: float) -> None:
    ep = endpoint(1, loras=running, waiting_loras=waiting, max_loras=max_loras)
    scorer = lora.create("lora", lora.Params(), ctx())
    assert scorer.score(request(model=ADAPTER), [ep], CycleState())[ep] == expected


def test_matches_the_target_model_not_the_incoming_one() -> None:
    ep = endpoint(1, loras=("rewritten",), max_loras=1)
    scorer = lora.create("lora", lora.Params(), ctx())
    assert scorer.score(request(model="incoming", target_model="rewritten"), [ep], CycleState())[ep] == 1.0
    assert scorer.category is Category.AFFINITY
    assert scorer.type == "lora-affinity-scorer"
