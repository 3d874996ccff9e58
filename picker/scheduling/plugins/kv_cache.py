"""kv-cache-utilization-scorer: prefer endpoints with free KV cache.

Type ``kv-cache-utilization-scorer`` (Distribution). Input: each candidate's scraped KV-cache usage ``kv`` in
[0, 1] (``vllm:kv_cache_usage_perc``). Score ``1 - kv``. No parameters.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from picker.plugins import Category, CycleState, Endpoint, InferenceRequest, PluginContext, PluginParams
from picker.scheduling.framework import Scorer
from picker.scheduling.scores import ScoreVector
from picker.scheduling.spec import PluginSpec

__all__ = ["SPEC", "TYPE", "KVCacheScorer", "Params", "create"]

TYPE = "kv-cache-utilization-scorer"


class Params(PluginParams):
    """No parameters."""


class KVCacheScorer:
    type: ClassVar[str] = TYPE
    category: ClassVar[Category] = Category.DISTRIBUTION
    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def score(self, req: InferenceRequest, endpoints: Sequence[Endpoint], cycle: CycleState) -> ScoreVector:
        return ScoreVector(endpoints, [1.0 - e.metrics.kv_usage for e in endpoints])


def create(name: str, params: Params, ctx: PluginContext) -> Scorer:
    return KVCacheScorer(name)


SPEC = PluginSpec(TYPE, Params, create)
