"""active-request-scorer (llm-d): prefer endpoints with fewer of picker's requests in flight.

Type ``active-request-scorer`` (Distribution). Input: n_e, picker's own in-flight request count on each candidate
(``PluginContext.load(e).requests``: +1 when routed, -1 when the response ends or its lease times out). Score:
n_e ≤ ``idleThreshold`` ⇒ 1.0; otherwise (max - n_e) / max * ``maxBusyScore``, max being the largest n among the
candidates. With ``maxBusyScore`` < 1 an idle endpoint beats every busy one by a clear gap.

Parameters: ``idleThreshold`` 0 (≥ 0); ``maxBusyScore`` 1.0 (in [0, 1]); ``requestTimeout`` (deprecated,
ignored: leases time out by ``--inflight-timeout``); ``inFlightLoadProducerName`` (accepted; one tracker).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from pydantic import Field

from picker.plugins import Category, CycleState, Endpoint, InferenceRequest, PluginContext, PluginParams
from picker.scheduling.framework import Scorer
from picker.scheduling.scores import ScoreVector
from picker.scheduling.spec import PluginSpec

__all__ = ["SPEC", "TYPE", "ActiveRequestScorer", "Params", "create"]

TYPE = "active-request-scorer"


class Params(PluginParams):
    idle_threshold: int = Field(default=0, ge=0)
    max_busy_score: float = Field(default=1.0, ge=0.0, le=1.0)
    request_timeout: str | None = None  # deprecated in llm-d, ignored
    in_flight_load_producer_name: str = ""


class ActiveRequestScorer:
    type: ClassVar[str] = TYPE
    category: ClassVar[Category] = Category.DISTRIBUTION
    __slots__ = ("_ctx", "_idle", "_max_busy", "name")

    def __init__(self, name: str, ctx: PluginContext, *, idle_threshold: int = 0, max_busy_score: float = 1.0) -> None:
        self.name = name
        self._ctx = ctx
        self._idle = idle_threshold
        self._max_busy = max_busy_score

    def score(self, req: InferenceRequest, endpoints: Sequence[Endpoint], cycle: CycleState) -> ScoreVector:
        load = self._ctx.load
        counts = [load(e).requests for e in endpoints]
        busiest = max(counts, default=0)
        idle, max_busy = self._idle, self._max_busy
        return ScoreVector(endpoints, [1.0 if n <= idle else (busiest - n) / busiest * max_busy for n in counts])


def create(name: str, params: Params, ctx: PluginContext) -> Scorer:
    return ActiveRequestScorer(name, ctx, idle_threshold=params.idle_threshold, max_busy_score=params.max_busy_score)


SPEC = PluginSpec(TYPE, Params, create)
