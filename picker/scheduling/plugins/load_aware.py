"""load-aware-scorer (llm-d): prefer endpoints with short waiting queues, on an absolute scale.

Type ``load-aware-scorer`` (Distribution). Input: each candidate's scraped waiting-queue length q. Score: q = 0 ⇒
0.5; otherwise 0.5 * (1 - min(q, T) / T) with T = ``threshold``. The scale tops out at 0.5 so that a future
"spare capacity" signal can score above an empty queue (llm-d's design); an endpoint with T or more waiting
scores 0.

Parameters: ``threshold`` 128 (≥ 1).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from pydantic import Field

from picker.plugins import Category, CycleState, Endpoint, InferenceRequest, PluginContext, PluginParams
from picker.scheduling.framework import Scorer
from picker.scheduling.scores import ScoreVector
from picker.scheduling.spec import PluginSpec

__all__ = ["SPEC", "TYPE", "LoadAwareScorer", "Params", "create"]

TYPE = "load-aware-scorer"
EMPTY_QUEUE_SCORE = 0.5


class Params(PluginParams):
    threshold: int = Field(default=128, ge=1)


class LoadAwareScorer:
    type: ClassVar[str] = TYPE
    category: ClassVar[Category] = Category.DISTRIBUTION
    __slots__ = ("_threshold", "name")

    def __init__(self, name: str, threshold: int = 128) -> None:
        self.name = name
        self._threshold = float(threshold)

    def score(self, req: InferenceRequest, endpoints: Sequence[Endpoint], cycle: CycleState) -> ScoreVector:
        threshold = self._threshold
        return ScoreVector(
            endpoints,
            [
                EMPTY_QUEUE_SCORE * (1.0 - min(e.metrics.waiting, threshold) / threshold)
                if e.metrics.waiting > 0
                else EMPTY_QUEUE_SCORE
                for e in endpoints
            ],
        )


def create(name: str, params: Params, ctx: PluginContext) -> Scorer:
    return LoadAwareScorer(name, params.threshold)


SPEC = PluginSpec(TYPE, Params, create)
