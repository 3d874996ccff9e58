"""lora-affinity-scorer: prefer endpoints where the request's LoRA adapter is (or can be) loaded.

Type ``lora-affinity-scorer`` (Affinity). Inputs: the request's target model (the adapter name) and each
candidate's scraped adapters (``vllm:lora_requests_info``: running, waiting, ``max_lora``). Score:

* the adapter is running ⇒ 1.0;
* else the endpoint has room for another adapter (distinct running-or-waiting adapters < ``max_lora``) ⇒ 0.8;
* else the adapter is waiting to be loaded ⇒ 0.6;
* else 0.0.

Adapters both running and waiting are counted once (vLLM reports them from one source). No parameters.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from picker.plugins import (
    Category,
    CycleState,
    Endpoint,
    EndpointMetrics,
    InferenceRequest,
    PluginContext,
    PluginParams,
)
from picker.scheduling.framework import Scorer
from picker.scheduling.scores import ScoreVector
from picker.scheduling.spec import PluginSpec

__all__ = ["SPEC", "TYPE", "LoraAffinityScorer", "Params", "adapter_fits", "create"]

TYPE = "lora-affinity-scorer"

ACTIVE = 1.0
HAS_CAPACITY = 0.8
WAITING = 0.6


class Params(PluginParams):
    """No parameters."""


def has_free_slot(m: EndpointMetrics) -> bool:
    """Room for one more adapter: distinct running-or-waiting adapters below ``max_lora``."""
    return bool(m.max_loras) and len(m.running_loras | m.waiting_loras) < m.max_loras  # no union unless needed


def adapter_fits(m: EndpointMetrics, adapter: str) -> bool:
    """Whether ``adapter`` runs on the server now or can be loaded beside what runs there (the scorer's 1.0 and
    0.8): elsewhere it waits until another adapter's requests drain and that one is unloaded."""
    return adapter in m.running_loras or has_free_slot(m)


class LoraAffinityScorer:
    type: ClassVar[str] = TYPE
    category: ClassVar[Category] = Category.AFFINITY
    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def score(self, req: InferenceRequest, endpoints: Sequence[Endpoint], cycle: CycleState) -> ScoreVector:
        adapter = req.lora_adapter
        scores: list[float] = []
        for e in endpoints:
            m = e.metrics
            if adapter in m.running_loras:
                scores.append(ACTIVE)
            elif has_free_slot(m):
                scores.append(HAS_CAPACITY)
            elif adapter in m.waiting_loras:
                scores.append(WAITING)
            else:
                scores.append(0.0)
        return ScoreVector(endpoints, scores)


def create(name: str, params: Params, ctx: PluginContext) -> Scorer:
    return LoraAffinityScorer(name)


SPEC = PluginSpec(TYPE, Params, create)
