"""tpot-trend-scorer: avoid endpoints whose observed time per output token (TPOT) is rising.

picker observes each endpoint's TPOT on the responses it routes (``ctx.load(endpoint).tpot_s``, a fast moving
average). This scorer keeps a slower average of that per endpoint; an endpoint whose current TPOT is more than
``tolerance`` above its slow average is getting slower, and scores ``slow / current`` (below 1). Endpoints that
are steady, improving, or not yet observed score 1.0. Scores are also discounted to ``staleScore`` when the
endpoint's scraped metrics are older than ``maxMetricsAgeS`` (it may be gone or wedged).

Parameters (camelCase in YAML): ``alpha`` 0.05 (weight of a new sample in the slow average), ``tolerance`` 0.1,
``maxMetricsAgeS`` 10, ``staleScore`` 0.5.
"""

from collections.abc import Sequence
from typing import ClassVar

from pydantic import Field

from picker.plugins import Category, CycleState, Endpoint, InferenceRequest, PluginContext, PluginParams, Scores


class TpotTrendParams(PluginParams):
    alpha: float = Field(default=0.05, gt=0.0, le=1.0)
    tolerance: float = Field(default=0.1, ge=0.0)
    max_metrics_age_s: float = Field(default=10.0, gt=0.0)
    stale_score: float = Field(default=0.5, ge=0.0, le=1.0)


class TpotTrendScorer:
    category: ClassVar[Category] = Category.DISTRIBUTION

    def __init__(self, params: TpotTrendParams, ctx: PluginContext) -> None:
        self.params = params
        self.ctx = ctx
        self.slow_tpot_s: dict[str, float] = {}  # endpoint key -> slow average of the observed TPOT

    def score(self, req: InferenceRequest, endpoints: Sequence[Endpoint], cycle: CycleState) -> Scores:
        p = self.params
        scores: list[float] = []
        for e in endpoints:
            score = 1.0
            tpot_s = self.ctx.load(e).tpot_s
            if tpot_s is not None and tpot_s > 0.0:
                slow = self.slow_tpot_s.get(e.key, tpot_s)
                slow += p.alpha * (tpot_s - slow)
                self.slow_tpot_s[e.key] = slow
                if tpot_s > slow * (1.0 + p.tolerance):
                    score = slow / tpot_s
            if self.ctx.metrics_age_s(e) > p.max_metrics_age_s:
                score = min(score, p.stale_score)
            scores.append(score)
        return scores

    def endpoints_changed(self, keys: frozenset[str]) -> None:
        """Forget endpoints that left the pool (a hook picker calls when membership changes)."""
        for key in [k for k in self.slow_tpot_s if k not in keys]:
            del self.slow_tpot_s[key]
