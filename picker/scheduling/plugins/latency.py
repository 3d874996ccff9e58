"""latency-scorer: prefer the server where this request is predicted to finish first (picker's server model).

Type ``latency-scorer`` (Balance; llm-d's type name for predicted-latency scheduling, here with picker's own
predictor instead of a sidecar). For each candidate the server model (``picker.scheduling.servermodel``)
predicts the request's TTFT and TPOT there, in seconds: the wait for a sequence slot on a full server, the
prefill of what is queued ahead and of this prompt's uncached part, the server's observed speed. Prefix
affinity is a term of that estimate: the plugin named by ``prefixFrom`` (a ``prefix-cache-scorer``, declared in
the config; it need not be in the profile) says how many prompt tokens each candidate caches.

Without SLO headers the score is ``best / cost`` with cost the predicted end-to-end time
``ttft + (answer - 1) * tpot`` (answer: ``max_tokens`` when the length is fixed, else the model's recent mean, at
most ``max_tokens``) plus what going there costs the requests behind it (``Estimate.cost_s``: this request's
prefill and the slot or KV room it takes, times 1 + the requests expected to arrive there while it waits; on a
full server, its share of the server held for its whole run, times the requests arriving meanwhile;
``picker.scheduling.servermodel``): the lowest cost scores 1.

With ``x-llm-d-slo-ttft-ms`` / ``x-llm-d-slo-tpot-ms`` (or the deprecated ``x-slo-ttft-ms`` / ``x-slo-tpot-ms``)
the prediction is held against the objectives: headroom = ``headroomTTFTWeight`` x (SLO - TTFT) / SLO +
``headroomTPOTWeight`` x the same for TPOT. Candidates that meet every objective score in [0.5, 1]; with
``headroomSelectionStrategy: most`` (picker's default) the one with the most headroom scores highest: a
prediction's error is a good part of an objective's margin, and the most headroom leaves the most of it. ``least``
(llm-d's default) prefers the least headroom, keeping the fastest servers for the requests that need them; it
packs requests where they barely meet their objective, and in the lab met fewer objectives than ignoring them
(docs/scheduling.md, "Latency objectives"). When none meets them, the smallest shortfall scores highest, below
0.5.

Parameters: ``prefixFrom`` ("prefix-cache-scorer"; "" for none), ``headroomTTFTWeight`` (0.8),
``headroomTPOTWeight`` (0.2), ``headroomSelectionStrategy`` (``least`` | ``most``).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection, Mapping, Sequence
from typing import ClassVar, Literal, Protocol, runtime_checkable

from pydantic import Field

from picker.plugins import Category, CycleState, Endpoint, InferenceRequest, PluginContext, PluginParams
from picker.request.slo import Slo, slo_of
from picker.scheduling.framework import UNCACHED_TOKENS, ResponseInfo, SchedulingResult, Scorer
from picker.scheduling.plugins.prefix import PrefixMatch
from picker.scheduling.scores import ScoreVector
from picker.scheduling.servermodel import Estimate, ServerModel, answer_tokens
from picker.scheduling.spec import PluginSpec

__all__ = ["SPEC", "TYPE", "LatencyScorer", "Params", "create"]

TYPE = "latency-scorer"
_FEASIBLE_FLOOR = 0.5  # candidates meeting every objective score at least this; the others below it
_PENDING_MAX = 65_536  # predictions kept for requests in flight (oldest dropped beyond)


class Params(PluginParams):
    prefix_from: str = "prefix-cache-scorer"
    headroom_ttft_weight: float = Field(default=0.8, ge=0.0)
    headroom_tpot_weight: float = Field(default=0.2, ge=0.0)
    headroom_selection_strategy: Literal["least", "most"] = "most"


@runtime_checkable
class PrefixSource(Protocol):
    """A plugin that matches a request against its prefix index (``prefix-cache-scorer``)."""

    def match(self, req: InferenceRequest, endpoints: Sequence[Endpoint], cycle: CycleState) -> PrefixMatch: ...


class LatencyScorer:
    type: ClassVar[str] = TYPE
    category: ClassVar[Category] = Category.BALANCE
    __slots__ = ("_pending", "_prefix", "_prefix_from", "_state_key", "model", "name", "params")

    def __init__(self, name: str, params: Params, ctx: PluginContext) -> None:
        self.name = name
        self.params = params
        self.model = ServerModel(ctx)
        self._prefix_from = params.prefix_from
        self._prefix: PrefixSource | None = None
        self._state_key = f"{TYPE}/{name}"
        self._pending: OrderedDict[str, Estimate] = OrderedDict()

    def bind(self, plugins: Mapping[str, object], profiles: Collection[str]) -> None:
        """Resolve ``prefixFrom`` (config loading)."""
        if not self._prefix_from:
            return
        plugin = plugins.get(self._prefix_from)
        if plugin is None:
            raise ValueError(f"prefixFrom names plugin {self._prefix_from!r}, which is not declared")
        if not isinstance(plugin, PrefixSource):
            raise ValueError(f"prefixFrom names plugin {self._prefix_from!r}, which has no prefix index")
        self._prefix = plugin

    def estimates(self, req: InferenceRequest, endpoints: Sequence[Endpoint], cycle: CycleState) -> list[Estimate]:
        """The server model's prediction for ``req`` on each candidate (also kept in ``cycle``)."""
        model = self.model
        model.observe_reports(endpoints)
        prefix = self._prefix
        if prefix is not None and endpoints:
            match = prefix.match(req, endpoints, cycle)
            prompt = match.prompt_tokens
            uncached = [prompt * f for f in match.uncached_fractions(endpoints)]
        else:
            uncached = [float(req.prompt_tokens)] * len(endpoints)
        cycle[UNCACHED_TOKENS] = {e.key: u for e, u in zip(endpoints, uncached, strict=True)}
        answer = answer_tokens(req.max_tokens or 0, req.fixed_output, model.mean_answer(req.target_model))
        found = model.estimate(req.target_model, answer, uncached, endpoints)
        cycle[self._state_key] = (endpoints, found, answer)
        return found

    def score(self, req: InferenceRequest, endpoints: Sequence[Endpoint], cycle: CycleState) -> ScoreVector:
        if not endpoints:
            return ScoreVector(endpoints, [])
        found = self.estimates(req, endpoints, cycle)
        answer: float = cycle[self._state_key][2]
        slo = slo_of(req)
        if slo is None:
            costs = [x.cost_s(answer) for x in found]
            best = min(costs)
            return ScoreVector(endpoints, [best / c if c > 0.0 else 1.0 for c in costs])
        return ScoreVector(endpoints, self._headroom_scores(found, slo))

    def _headroom_scores(self, found: Sequence[Estimate], slo: Slo) -> list[float]:
        params = self.params
        terms: list[tuple[float, float, bool]] = []  # (weight, objective, is TTFT)
        if slo.ttft_s is not None:
            terms.append((params.headroom_ttft_weight, slo.ttft_s, True))
        if slo.tpot_s is not None:
            terms.append((params.headroom_tpot_weight, slo.tpot_s, False))
        total = sum(w for w, _, _ in terms) or 1.0
        headroom = [
            sum(w * (goal - (x.ttft_s if is_ttft else x.tpot_s)) / goal for w, goal, is_ttft in terms) / total
            for x in found
        ]
        shortfall = [
            sum(w * max(0.0, (x.ttft_s if is_ttft else x.tpot_s) - goal) / goal for w, goal, is_ttft in terms)
            for x in found
        ]
        feasible = [all((x.ttft_s if is_ttft else x.tpot_s) <= goal for _, goal, is_ttft in terms) for x in found]
        if not any(feasible):  # the smallest shortfall first, below every candidate that meets the objectives
            short = [max(s, 1e-9) for s in shortfall]
            least = min(short)
            return [_FEASIBLE_FLOOR * 0.999 * least / s for s in short]
        met = [h for h, ok in zip(headroom, feasible, strict=True) if ok]
        low, high = min(met), max(met)
        span = high - low
        least = params.headroom_selection_strategy == "least"
        scores = []
        for h, ok in zip(headroom, feasible, strict=True):
            if not ok:
                scores.append(0.0)
                continue
            rank = 1.0 if span <= 0.0 else ((high - h) / span if least else (h - low) / span)
            scores.append(_FEASIBLE_FLOOR + (1.0 - _FEASIBLE_FLOOR) * rank)
        return scores

    def pre_request(self, req: InferenceRequest, result: SchedulingResult) -> None:
        """Keep the chosen server's prediction: the first token tells how long the prefill took, the end how long
        each step."""
        if not result.targets or result.cycle is None:
            return
        state = result.cycle.get(self._state_key)
        if state is None:
            return
        endpoints, found, _ = state
        target = result.targets[0].key
        now = self.model.now()
        self.model.observe_arrival(now, target)
        for e, x in zip(endpoints, found, strict=True):
            if e.key == target:
                pending = self._pending
                pending[req.request_id] = x
                self.model.expect_first_token(target, req.request_id, now, x.ttft_s)
                if len(pending) > _PENDING_MAX:
                    pending.popitem(last=False)
                uncached = result.cycle.get(UNCACHED_TOKENS)
                if uncached is not None:
                    self.model.observe_prompt(uncached.get(target, 0.0))
                return

    def first_token(self, req: InferenceRequest, info: ResponseInfo) -> None:
        self.model.first_token_seen(info.endpoint_key, req.request_id)
        predicted = self._pending.get(req.request_id)
        if predicted is not None and info.ttft_s is not None:
            self.model.observe_first_token(info.ttft_s, predicted)

    def post_response(self, req: InferenceRequest, info: ResponseInfo) -> None:
        """Learn the model's answer length and, from a streamed answer's TPOT, the server's step time."""
        predicted = self._pending.pop(req.request_id, None)
        if info.endpoint_key:
            self.model.observe_done(info.endpoint_key)
            self.model.first_token_seen(info.endpoint_key, req.request_id)
        n = info.completion_tokens
        if not n:
            return
        self.model.observe_answer(req.target_model, n)
        ttft, total = info.ttft_s, info.duration_s
        if predicted is not None and ttft is not None and total is not None and n > 1 and total > ttft:
            batch = (predicted.batch + self.model.batch(info.endpoint_key)) / 2.0
            self.model.observe_step(info.endpoint_key, batch, (total - ttft) / (n - 1))

    def endpoints_changed(self, keys: frozenset[str]) -> None:
        self.model.forget(keys)


def create(name: str, params: Params, ctx: PluginContext) -> Scorer:
    return LatencyScorer(name, params, ctx)


SPEC = PluginSpec(TYPE, Params, create)
