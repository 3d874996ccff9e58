"""queue-scorer: prefer endpoints with shorter waiting queues.

Type ``queue-scorer`` (Distribution). Input: each candidate's scraped waiting-queue length ``q``
(``vllm:num_requests_waiting``). Score ``(maxQ - q) / (maxQ - minQ)`` over the candidates; all equal ⇒ 1.0.
No parameters.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from picker.plugins import Category, CycleState, Endpoint, InferenceRequest, PluginContext, PluginParams
from picker.scheduling.framework import Scorer
from picker.scheduling.scores import ScoreVector
from picker.scheduling.spec import PluginSpec

__all__ = ["SPEC", "TYPE", "Params", "QueueScorer", "create"]

TYPE = "queue-scorer"


class Params(PluginParams):
    """No parameters."""


class QueueScorer:
    type: ClassVar[str] = TYPE
    category: ClassVar[Category] = Category.DISTRIBUTION
    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def score(self, req: InferenceRequest, endpoints: Sequence[Endpoint], cycle: CycleState) -> ScoreVector:
        return ScoreVector.fewer_is_better(endpoints, [e.metrics.waiting for e in endpoints])


def create(name: str, params: Params, ctx: PluginContext) -> Scorer:
    return QueueScorer(name)


SPEC = PluginSpec(TYPE, Params, create)
