"""token-load-scorer: prefer endpoints with fewer tokens of work in flight.

Type ``token-load-scorer`` (Distribution). Inputs: picker's own in-flight tokens on each candidate
(``PluginContext.load(e).tokens``: prompt tokens not yet prefilled + expected output tokens of every request
routed there and not finished) plus this request's own load there: its prompt tokens * (1 - matched fraction on
that endpoint), the fraction from a prefix plugin that scored earlier in the cycle (``PrefixMatch``; none ⇒ the
whole prompt). Score ``1 - min(L, T) / T`` with L that sum and T = ``queueThresholdTokens``; L ≤ 0 ⇒ 1.0. With a
peer exchange between picker replicas (docs/ha.md) the ledger is the pool's: picker's own in-flight tokens plus
those its peers reported.

Parameters (reference names and defaults): ``queueThresholdTokens`` 4 194 304 (128 requests * 32K tokens);
``inFlightLoadProducerName`` (accepted; picker has one in-flight tracker). picker's, off by default (what
picker's previous default, ``picker-v2``, sets, and why: docs/scheduling.md, "The previous default"):

* ``loadSource`` ``ledger`` (default, the reference's) | ``blended``: the in-flight part also counts what each
  server reported beyond picker's own requests (``PluginContext.server_load``: the last scrape corrected by what
  picker sent and saw finish since), from other replicas, gateways, clients that bypass picker or from before a
  restart, each weighted as an average request picker routed (waiting: prompt + answer; running: the answer).
  Since the report the others are assumed to have sent where picker did, in proportion to each server's traffic
  per request of picker's there (``serverload``). Without a fresh sample it is the ledger alone.
* ``prefillPendingTokens`` 0 (off): for a prompt shorter than this many tokens, an endpoint where a request picker
  sent has not had its first token yet counts this many tokens more. The request waits for that prefill's engine
  step (a fixed cost per step, worth a few hundred prompt tokens on a GPU), which its token count alone does not
  show, so short requests would come in runs on one server. Longer prompts are not marked: their own prefill
  outweighs the wait, and steering them off a prefilling server moves new sessions off the server that would
  cache them. Counts picker's own requests only (peers report no first tokens); a response picker does not see
  streamed keeps its server marked until it ends.
* ``prefillPendingSpeedFrom`` "" (off) names a plugin that rates each server's speed (a ``relative-ttft-scorer``):
  the mark counts in that server's time, ``f`` marks on a server ``f`` times slower than the pool with a prefill
  pending and ``f - 1`` without one (its own next prefill step is that much longer), so a slow server that is sent
  less, and so more often has no prefill pending, does not draw short requests.
* ``shortPromptTokens`` 0 (off; at most ``prefillPendingTokens``): a streamed prompt shorter than this waits for
  the prefills ahead of it, not for the answers being decoded (in a continuous batch a decoding sequence adds a
  fraction of a millisecond to a step, a prefill step tens of milliseconds). For such a request, while at least
  half of the recent requests (about 50) are such, the load is ``prefillPendingTokens`` for each request the server
  reported waiting beyond picker's own (``server_waiting``: a full batch or KV cache shows as waiting), plus ``f -
  1`` marks on a slow server; decode tokens do not count. Servers left equal tie, and the request asks the picker
  to break ties by a rotation (``framework.ROTATE_TIES``), spacing short requests as round robin does rather than
  following the decode load as least connections does. picker's own pending prefills count only as a backlog
  (beyond twice the candidates' mean plus one, a mark each), since the rotation spaces them and a hung server
  must not keep its turns. While short prompts are a minority, the long prompts' prefills and the adapters' queues
  decide their wait too, and the tokens in flight count as for any request; so do they for a request that is not
  streamed, which waits for its whole answer (and they show a stalled server, whose requests linger).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import ClassVar, Literal

from pydantic import Field, model_validator

from picker.plugins import Category, CycleState, Endpoint, InferenceRequest, PluginContext, PluginParams
from picker.scheduling import native
from picker.scheduling.decaying import RecentShare
from picker.scheduling.framework import ROTATE_TIES, Scorer
from picker.scheduling.plugins.prefix import MATCH_STATE, PrefixMatch
from picker.scheduling.scores import ScoreVector
from picker.scheduling.spec import PluginSpec
from picker.scheduling.speed import SpeedSource, resolve_speed_source

__all__ = ["SPEC", "TYPE", "Params", "TokenLoadScorer", "create"]

TYPE = "token-load-scorer"


class Params(PluginParams):
    queue_threshold_tokens: int = Field(default=4_194_304, ge=1)
    in_flight_load_producer_name: str = ""
    load_source: Literal["ledger", "blended"] = "ledger"
    prefill_pending_tokens: int = Field(default=0, ge=0)
    prefill_pending_speed_from: str = ""
    short_prompt_tokens: int = Field(default=0, ge=0)

    @model_validator(mode="after")
    def _short_needs_the_mark(self) -> Params:
        if self.short_prompt_tokens > self.prefill_pending_tokens:
            raise ValueError(
                "shortPromptTokens counts waiting requests in prefillPendingTokens: set prefillPendingTokens to at"
                f" least {self.short_prompt_tokens}"
            )
        return self


# At least half of the recent requests (about the last 50) must be short and streamed.
_SHORT_SHARE_MIN = 0.5
# Short prompts: picker's own pending prefills on a server beyond twice the candidates' mean plus one count a
# mark each (a server that stopped answering keeps its turns in the rotation otherwise).
_BACKLOG_TIMES_MEAN = 2.0
_BACKLOG_SLACK = 1.0


class TokenLoadScorer:
    type: ClassVar[str] = TYPE
    category: ClassVar[Category] = Category.DISTRIBUTION
    __slots__ = (
        "_blended",
        "_ctx",
        "_prefill_pending",
        "_short",
        "_short_share",
        "_speed",
        "_speed_from",
        "_threshold",
        "name",
    )

    def __init__(
        self,
        name: str,
        threshold_tokens: int,
        ctx: PluginContext,
        *,
        blended: bool = False,
        prefill_pending_tokens: int = 0,
        prefill_pending_speed_from: str = "",
        short_prompt_tokens: int = 0,
    ) -> None:
        self.name = name
        self._prefill_pending = float(prefill_pending_tokens)
        self._short = float(short_prompt_tokens)
        self._short_share = RecentShare()
        self._speed_from = prefill_pending_speed_from
        self._speed: SpeedSource | None = None  # resolved by ``bind``
        self._threshold = float(threshold_tokens)
        self._ctx = ctx
        self._blended = blended

    @property
    def blended(self) -> bool:
        """Whether the servers' reported load counts (``loadSource: blended``), not only picker's ledger."""
        return self._blended

    def score(self, req: InferenceRequest, endpoints: Sequence[Endpoint], cycle: CycleState) -> ScoreVector:
        match = cycle.get(MATCH_STATE)
        prompt = float(req.prompt_tokens)
        ctx = self._ctx
        pending = self._prefill_pending
        speed = self._speed
        loads: list[float]
        if self._short and self._short_prompt(prompt, req.stream):
            cycle[ROTATE_TIES] = True
            # The queue ahead: requests the server reports waiting beyond picker's, and a slow server's own next
            # prefill step. picker's own pending prefills only as a backlog: the rotation spaces them (the module's
            # docstring).
            loads = [pending * w for w in native.server_waiting(ctx, endpoints)]
            if endpoints:  # a backlog of picker's own: the server has stopped keeping up with its turns
                prefilling = ctx.inflight.prefilling_of(endpoints)
                limit = _BACKLOG_TIMES_MEAN * sum(prefilling) / len(prefilling) + _BACKLOG_SLACK
                loads = [x + pending * (n - limit) if n > limit else x for x, n in zip(loads, prefilling, strict=True)]
            if speed is not None:
                loads = [x + pending * (f - 1.0) for x, f in zip(loads, speed.slowness_factors(endpoints), strict=True)]
            return self._scores(endpoints, loads)
        in_flight: list[int] | list[float] = (
            native.server_tokens(ctx, endpoints) if self._blended else ctx.ledger_tokens(endpoints)
        )
        if isinstance(match, PrefixMatch):
            loads = [t + prompt * u for t, u in zip(in_flight, match.uncached_fractions(endpoints), strict=True)]
        else:
            loads = [t + prompt for t in in_flight]
        if pending and prompt < pending:  # a server with a prefill of picker's waiting: this waits for that step
            prefilling = ctx.inflight.prefilling_of(endpoints)
            if speed is None:
                loads = [x + pending if n else x for x, n in zip(loads, prefilling, strict=True)]
            else:
                factors = speed.slowness_factors(endpoints)
                loads = [
                    x + pending * (f if n else f - 1.0) for x, n, f in zip(loads, prefilling, factors, strict=True)
                ]
        return self._scores(endpoints, loads)

    def _scores(self, endpoints: Sequence[Endpoint], loads: Sequence[float]) -> ScoreVector:
        threshold = self._threshold
        return ScoreVector(endpoints, [1.0 if x <= 0 else 1.0 - min(x, threshold) / threshold for x in loads])

    def _short_prompt(self, prompt: float, stream: bool) -> bool:
        """Whether this prompt is short and streamed, and such prompts are most of the recent ones (updates the
        share)."""
        short = stream and prompt < self._short
        return self._short_share.add(short) >= _SHORT_SHARE_MIN and short

    def bind(self, plugins: Mapping[str, object], profiles: Collection[str]) -> None:
        """Resolve ``prefillPendingSpeedFrom`` (config loading)."""
        if self._speed_from:
            self._speed = resolve_speed_source(plugins, "prefillPendingSpeedFrom", self._speed_from)


def create(name: str, params: Params, ctx: PluginContext) -> Scorer:
    return TokenLoadScorer(
        name,
        params.queue_threshold_tokens,
        ctx,
        blended=params.load_source == "blended",
        prefill_pending_tokens=params.prefill_pending_tokens,
        prefill_pending_speed_from=params.prefill_pending_speed_from,
        short_prompt_tokens=params.short_prompt_tokens,
    )


SPEC = PluginSpec(TYPE, Params, create)
