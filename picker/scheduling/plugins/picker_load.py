"""picker-load-scorer (picker's): prefer the endpoint with the least work ahead of this request, in tokens.

Type ``picker-load-scorer`` (Distribution). It combines picker's exact in-flight accounting with the model
server's scraped numbers, which also count traffic picker did not route (other EPP replicas, direct clients)
but lag by up to a scrape interval:

    W_e = max(T_e, q_e * t_q) + U_e
    score_e = 1 - W_e / max_c W_c        (every W equal, zero included ⇒ 1.0)
    score_e = 0 when kv_e ≥ kvCacheUtilThreshold

* T_e: picker's in-flight tokens on e (prompt tokens not yet prefilled + expected output tokens);
* q_e: the scraped waiting queue; t_q = ``tokensPerQueuedRequest``, or when 0 (default) the mean tokens of
  picker's own in-flight requests across the candidates (1024 when there are none): a scraped waiting request is
  assumed to be an average one;
* U_e: this request's uncached prompt tokens on e, P * (1 - matched fraction), the fraction from a prefix plugin
  earlier in the cycle (none ⇒ P), P from a ``TokenEstimator`` calibrated on responses;
* kv_e: scraped KV-cache use; an endpoint that full risks preemptions whatever its queue says.

The max() takes whichever view sees more work, so neither stale scrapes nor unseen traffic hide load. Scores
are proportional (no thresholds to tune): an endpoint with half the busiest one's work scores 0.5.

Parameters: ``tokensPerQueuedRequest`` 0 (auto); ``kvCacheUtilThreshold`` 0.95 (in (0, 1]; 1 turns the guard
off); ``charsPerToken`` 4 and ``calibrateTokens`` true (the estimator).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from pydantic import Field

from picker.plugins import (
    Category,
    CycleState,
    Endpoint,
    InferenceRequest,
    PluginContext,
    PluginParams,
    ResponseInfo,
)
from picker.scheduling.framework import Scorer
from picker.scheduling.plugins.prefix import MATCH_STATE, PrefixMatch
from picker.scheduling.scores import ScoreVector
from picker.scheduling.spec import PluginSpec
from picker.scheduling.tokens import DEFAULT_CHARS_PER_TOKEN, TokenEstimator

__all__ = ["DEFAULT_QUEUED_REQUEST_TOKENS", "SPEC", "TYPE", "Params", "PickerLoadScorer", "create"]

TYPE = "picker-load-scorer"
DEFAULT_QUEUED_REQUEST_TOKENS = 1024


class Params(PluginParams):
    tokens_per_queued_request: int = Field(default=0, ge=0)
    kv_cache_util_threshold: float = Field(default=0.95, gt=0.0, le=1.0)
    chars_per_token: float = Field(default=DEFAULT_CHARS_PER_TOKEN, gt=0.0, le=16.0)
    calibrate_tokens: bool = True


class PickerLoadScorer:
    type: ClassVar[str] = TYPE
    category: ClassVar[Category] = Category.DISTRIBUTION

    def __init__(self, name: str, params: Params, ctx: PluginContext) -> None:
        self.name = name
        self.params = params
        self.tokens = TokenEstimator(params.chars_per_token, calibrate=params.calibrate_tokens)
        self._ctx = ctx

    def score(self, req: InferenceRequest, endpoints: Sequence[Endpoint], cycle: CycleState) -> ScoreVector:
        if not endpoints:
            return ScoreVector(endpoints, [])
        loads = [self._ctx.load(e) for e in endpoints]
        per_queued = float(self.params.tokens_per_queued_request)
        if per_queued <= 0.0:
            requests = sum(load.requests for load in loads)
            per_queued = sum(load.tokens for load in loads) / requests if requests else DEFAULT_QUEUED_REQUEST_TOKENS
        prompt = self.tokens.prompt_tokens(req)
        match = cycle.get(MATCH_STATE)
        work: list[float] = []
        for e, load in zip(endpoints, loads, strict=True):
            uncached = prompt * (1.0 - match.matched_fraction(e.key)) if isinstance(match, PrefixMatch) else prompt
            work.append(max(float(load.tokens), e.metrics.waiting * per_queued) + uncached)
        high, low = max(work), min(work)
        kv_limit = self.params.kv_cache_util_threshold
        scores = [1.0] * len(work) if high == low else [1.0 - w / high for w in work]
        if kv_limit < 1.0:
            scores = [0.0 if e.metrics.kv_usage >= kv_limit else s for e, s in zip(endpoints, scores, strict=True)]
        return ScoreVector(endpoints, scores)

    def post_response(self, req: InferenceRequest, info: ResponseInfo) -> None:
        self.tokens.observe(req, info.prompt_tokens)


def create(name: str, params: Params, ctx: PluginContext) -> Scorer:
    return PickerLoadScorer(name, params, ctx)


SPEC = PluginSpec(TYPE, Params, create)
