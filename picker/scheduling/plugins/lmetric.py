"""lmetric-scorer (picker's): the tuning-free product of prefill work and load (LMetric, arXiv 2603.15202).

Type ``lmetric-scorer`` (Balance). For each candidate e:

    cost_e  = max(1, P - M_e) * (B_e + 1)
    score_e = 1 - cost_e / max_c cost_c        (every cost equal ⇒ 1.0)

* P: the prompt's tokens (``TokenEstimator``, calibrated on responses' usage);
* M_e: prompt tokens e holds in its prefix cache, P * min(1, matched_blocks * block_chars / prompt_chars), from
  this scorer's own approximate prefix index (the ``prefix-cache-scorer`` index: same hashing, learning on
  PreRequest, purge) - so the first factor is the uncached prefill work the request brings to e (at least one
  token: the last is always computed);
* B_e: e's batch, by ``loadSource``: ``inflight`` picker's in-flight requests there, ``scraped`` the scraped
  running + waiting requests, ``max`` (default) the larger of the two.

Lowest cost wins (as SGLang's ``lmetric`` policy and Dynamo's ``router_selection_policy=lmetric``): alone with
``max-score-picker`` it picks argmin cost with no weights to tune. A full prefix hit on a busy endpoint competes
with a cold idle one in the same unit (tokens x requests), which is the point.

Parameters: those of ``prefix-cache-scorer`` for the index (``blockSizeTokens``, ``autoTune``,
``maxPrefixBlocksToMatch``, ``maxPrefixTokensToMatch``, ``lruCapacityPerServer``, ``charsPerToken``,
``calibrateTokens``; its score options do not apply), and ``loadSource`` ``max`` | ``inflight`` | ``scraped``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar, Literal

from picker.plugins import Category, CycleState, Endpoint, InferenceRequest, PluginContext
from picker.scheduling.framework import Scorer
from picker.scheduling.plugins import prefix
from picker.scheduling.scores import ScoreVector
from picker.scheduling.spec import PluginSpec

__all__ = ["SPEC", "TYPE", "LMetricScorer", "Params", "create"]

TYPE = "lmetric-scorer"


class Params(prefix.Params):
    load_source: Literal["max", "inflight", "scraped"] = "max"


class LMetricScorer(prefix.PrefixCacheScorer):
    type: ClassVar[str] = TYPE
    category: ClassVar[Category] = Category.BALANCE

    def __init__(self, name: str, params: Params, ctx: PluginContext) -> None:
        super().__init__(name, params, ctx)
        self._source = params.load_source
        self._load_ctx = ctx

    def _uses_tokens(self) -> bool:
        return True

    def costs(self, req: InferenceRequest, endpoints: Sequence[Endpoint], cycle: CycleState) -> list[float]:
        """cost_e per candidate (the module docstring's formula)."""
        match = self.match(req, endpoints, cycle)
        load = self._load_ctx.load
        source = self._source
        out: list[float] = []
        for e in endpoints:
            own = load(e).requests
            scraped = e.metrics.running + e.metrics.waiting
            batch = own if source == "inflight" else scraped if source == "scraped" else max(own, scraped)
            out.append(max(1.0, match.uncached_tokens(e.key)) * (batch + 1))
        return out

    def score(self, req: InferenceRequest, endpoints: Sequence[Endpoint], cycle: CycleState) -> ScoreVector:
        if not endpoints:
            return ScoreVector(endpoints, [])
        costs = self.costs(req, endpoints, cycle)
        high = max(costs)
        if high == min(costs):
            return ScoreVector.constant(endpoints, 1.0)
        return ScoreVector(endpoints, [1.0 - c / high for c in costs])


def create(name: str, params: Params, ctx: PluginContext) -> Scorer:
    return LMetricScorer(name, params, ctx)


SPEC = PluginSpec(TYPE, Params, create)
