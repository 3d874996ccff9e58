"""token-load-scorer: prefer endpoints with fewer tokens of work in flight.

Type ``token-load-scorer`` (Distribution). Inputs: picker's own in-flight tokens on each candidate
(``PluginContext.load(e).tokens``: prompt tokens not yet prefilled + expected output tokens of every request
routed there and not finished) plus this request's own load there: its prompt tokens * (1 - matched fraction on
that endpoint), the fraction from a prefix plugin that scored earlier in the cycle (``PrefixMatch``; none ⇒ the
whole prompt). Score ``1 - min(L, T) / T`` with L that sum and T = ``queueThresholdTokens``; L ≤ 0 ⇒ 1.0. With a
peer exchange between picker replicas (docs/ha.md) the ledger is the pool's: picker's own in-flight tokens plus
those its peers reported.

Parameters (reference names and defaults): ``queueThresholdTokens`` 4 194 304 (128 requests * 32K tokens);
``inFlightLoadProducerName`` (accepted; picker has one in-flight tracker).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from pydantic import Field

from picker.plugins import Category, CycleState, Endpoint, InferenceRequest, PluginContext, PluginParams
from picker.scheduling.framework import Scorer
from picker.scheduling.plugins.prefix import MATCH_STATE, PrefixMatch
from picker.scheduling.scores import ScoreVector
from picker.scheduling.spec import PluginSpec

__all__ = ["SPEC", "TYPE", "Params", "TokenLoadScorer", "create"]

TYPE = "token-load-scorer"


class Params(PluginParams):
    queue_threshold_tokens: int = Field(default=4_194_304, ge=1)
    in_flight_load_producer_name: str = ""


class TokenLoadScorer:
    type: ClassVar[str] = TYPE
    category: ClassVar[Category] = Category.DISTRIBUTION
    __slots__ = ("_ctx", "_threshold", "name")

    def __init__(self, name: str, threshold_tokens: int, ctx: PluginContext) -> None:
        self.name = name
        self._threshold = float(threshold_tokens)
        self._ctx = ctx

    def score(self, req: InferenceRequest, endpoints: Sequence[Endpoint], cycle: CycleState) -> ScoreVector:
        match = cycle.get(MATCH_STATE)
        prompt = float(req.prompt_tokens)
        in_flight = self._ctx.ledger_tokens(endpoints)
        if isinstance(match, PrefixMatch):
            loads = [t + prompt * u for t, u in zip(in_flight, match.uncached_fractions(endpoints), strict=True)]
        else:
            loads = [t + prompt for t in in_flight]
        threshold = self._threshold
        return ScoreVector(endpoints, [1.0 if x <= 0 else 1.0 - min(x, threshold) / threshold for x in loads])


def create(name: str, params: Params, ctx: PluginContext) -> Scorer:
    return TokenLoadScorer(name, params.queue_threshold_tokens, ctx)


SPEC = PluginSpec(TYPE, Params, create)
