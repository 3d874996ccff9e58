"""prefix-cache-scorer: prefer endpoints that were recently sent the same prompt prefix (approximate).

Type ``prefix-cache-scorer`` (Affinity). Inputs: the request's prompt text, target model and body ``cache_salt``;
the index of what picker itself sent where (``prefix_index``). Score for an endpoint: the blocks it holds along
the request's prefix walk ÷ the request's blocks (partial tail block included); a prompt shorter than one block
scores 0 everywhere.

Learning (PreRequest): the request's hashes are added to the primary target and to the ``prefill`` profile's
target, if any; with a peer exchange between replicas (docs/ha.md) each placement is announced (``on_learn``) and
learned by the others as their own (``learn_placement``). Nothing is learned from real cache events (that is
``precise-prefix-cache-scorer``). Endpoints that leave the pool are purged (``endpoints_changed``). Each cycle's
match is left in the ``CycleState`` as a ``PrefixMatch`` (under ``match_key(name)`` and ``MATCH_STATE``) for
later plugins (``no-hit-lru-scorer``, ``token-load-scorer``, ``picker-load-scorer``).

Parameters (reference names and defaults): ``blockSizeTokens`` 16 (a block is that many tokens of
``charsPerToken`` characters); ``autoTune`` true (block size from the first candidate's ``block_size`` metric, LRU
capacity from its ``num_gpu_blocks``); ``maxPrefixBlocksToMatch`` 256; ``maxPrefixTokensToMatch`` 0 (> 0 overrides
the block limit); ``lruCapacityPerServer`` 31250 blocks; ``blockSize`` (deprecated, characters; used only when
``blockSizeTokens`` is not given).

picker's options, all off by default so the reference behaviour is unchanged (which of them picker's previous
default, ``picker-v2``, turns on, and why: docs/scheduling.md, "The previous default"):

* ``scoreMode`` ``ratio`` (reference) | ``tokens``: score = min(1, matched_tokens / ``saturationTokens`` (2048)),
  matched_tokens = P * min(1, matched_blocks * block_chars / prompt_chars), P the prompt's tokens from a
  ``TokenEstimator`` calibrated on responses' usage (``calibrateTokens`` true), so a short prompt matched whole
  scores less than a long one (the ratio's defect, GIE #2561). ``charsPerToken`` 4: characters per token.
* ``maxLoadFactor`` 0 (off; else ≥ 1) and ``loadCapFloor`` 1: a bounded-load cap on hot prefixes. With n_e the
  requests e works on (``PluginContext.server_load``: picker's in flight plus what the server reported beyond
  them) and N candidates, an endpoint with n_e + 1 > max(ceil(maxLoadFactor * (Σn + 1) / N), loadCapFloor) scores
  0, affinity and cold spread alike: the request goes elsewhere and the prefix replicates there, and the server
  with the emptiest cache (just added, back from a slow spell) does not take every new prefix at once. A floor of
  1 is pure bounded load; raise it to keep affinity until an endpoint has that many requests.
* ``coldSpread`` 0 (off; ≤ 1): a request whose blocks no candidate holds scores
  coldSpread * (1 - blocks_e / max_c blocks_c), so new prefixes go to the endpoint with the least cached content
  (SGLang's smallest tree). ``coldSpreadBasis`` says what blocks_e counts: ``held`` (default; the index's blocks
  for e, capped at e's KV size, so all equal once every cache is full) or ``placed`` (the new blocks picker sent to
  e, fading with a half-life of ``placedHalfLifeS``, 60 s, ≥ 1 s: still telling when caches are full).
* ``coldSpreadSpeedFrom`` "" (off) names a plugin that rates each server's speed against the pool (a
  ``relative-ttft-scorer``: 1 within its tolerance, k for k times slower). A cold prompt shorter than
  ``coldSpreadSpeedMaxTokens`` (32, ≥ 1) leaves at most one block to reuse, so its spread only balances request
  counts: blocks_e counts times e's factor and a server k times slower takes about 1/k of its share. Longer prompts
  are spread by content alone: their spread decides where a prefix is cached, which a server slow only because it
  is busy now should not lose.
* ``coldSpreadPlacedWhenFull`` false: once the index holds 90 % of a full KV cache for every candidate
  (``num_gpu_blocks`` with ``autoTune``, else ``lruCapacityPerServer``), the spread counts the blocks placed lately
  (as ``placed``), each server's times its slowness in whole multiples (1 below 2x, so queue jitter does not
  reorder servers). When besides every candidate reports requests waiting and at least half of the recent prompts
  (about 50) hit some server, the spread is sharp, coldSpread * (max - blocks_e) / (max - min): sessions come back
  where they were placed, so new ones should go round the pool, not to the shortest queue of the moment. Where the
  servers' requests are nearly all picker's and its peers' (at most 10 % others', a moving average over cold
  prompts that starts at "all others'"), only the least placed server scores the spread (a strict round), and the
  pool counts as queueing when every server queued at a quarter of the recent cold prompts or the servers report
  two waiting requests each on average. Where others fill much of the queues, the load scorers keep their say.
  The shares are each replica's own: without the peer exchange another replica's sessions look cold.
* ``coldSpreadDebtLimit`` 0 (off; ≥ 0): where the spread counts blocks placed lately, a candidate is owed at most
  this many times the cold prompt's blocks below the candidates' median; the rest is forgiven, so a server that
  took little for a while (shunned as slow, just added, restarted) takes its turn rather than every new session
  until it has caught up. 1 leaves an orderly round as it is.
* ``coldSpreadLoraFit`` false: a cold prompt for a LoRA adapter gets no spread on a server where the adapter
  neither runs nor has a free slot (lora-affinity-scorer's 1.0 and 0.8) while one where it fits is a candidate:
  there it would wait for another adapter to drain and unload. Base-model requests are spread as any.
* ``coldSpreadHome`` false: a cold prompt of at least ``coldSpreadSpeedMaxTokens`` tokens scores the spread on
  one candidate only, the first by rendezvous hashing of its first ``coldSpreadHomeTokens`` tokens (256, ≥ 1), so
  routers that cannot exchange placements put a prefix on the same server without telling each other. It gives
  up the spread's balance (a ``maxLoadFactor`` cap still applies) and costs a hash per candidate per cold prompt;
  the large-pool pre-filter keeps the home among the candidates. Replicas with the peer exchange know each
  other's placements and do better without it (docs/performance.md, "An option for routers that cannot
  exchange").
* ``balanceAbsThreshold`` 0 (off; else requests > 0) and ``balanceRelThreshold`` 1.1 (≥ 1): bounded imbalance
  after SGLang's cache-aware router, tested per endpoint: with n_e as for the cap and m the least n among the
  candidates, an endpoint with n_e - m > abs and n_e > rel * m scores 0 here (no affinity, no spread), so the load
  scorers place the request among the others. It acts as soon as one server is far behind, where the cap waits for
  a multiple of the mean; LoRA affinity and the cycle's match are untouched (docs/scheduling.md, "The tie-break
  and the imbalance rule").
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import ClassVar, Literal, NamedTuple

import xxhash
from pydantic import Field, field_validator

from picker.plugins import (
    Category,
    CycleState,
    Endpoint,
    InferenceRequest,
    PluginContext,
    PluginParams,
    ResponseInfo,
    SchedulingResult,
)
from picker.scheduling import native
from picker.scheduling.decaying import DecayingCounts, RecentShare
from picker.scheduling.framework import Scorer
from picker.scheduling.plugins.lora import adapter_fits
from picker.scheduling.plugins.prefix_index import PrefixIndex, prefix_hashes
from picker.scheduling.scores import ScoreVector
from picker.scheduling.spec import PluginSpec
from picker.scheduling.speed import SpeedSource, resolve_speed_source
from picker.scheduling.tokens import DEFAULT_CHARS_PER_TOKEN, TokenEstimator

__all__ = [
    "MATCH_STATE",
    "SPEC",
    "TYPE",
    "Params",
    "PrefixCacheScorer",
    "PrefixMatch",
    "create",
    "match_key",
    "over_bound",
]

TYPE = "prefix-cache-scorer"
_FULL_INDEX_SHARE = 0.9  # coldSpreadPlacedWhenFull: an index this full of a server's KV size counts as full
# coldSpreadPlacedWhenFull, where picker sent nearly all the work (other clients' requests at most this share of
# the servers' recent ones) the spread is sharp once every server queued at this share of the recent cold prompts.
_FOREIGN_SHARE_MAX = 0.1
_QUEUED_SHARE_MIN = 0.25
# ... and it counts the pool as queued when its servers hold this many requests waiting per server on average, even
# with one queue empty: far past the knee the pool's queue would fill that server many times over.
_QUEUED_MEAN_MIN = 2.0
CHARS_PER_TOKEN = 4
PREFILL_PROFILE = "prefill"
MATCH_STATE = "prefix-match"  # CycleState key: the match of the last prefix plugin that scored in the cycle


def match_key(name: str) -> str:
    """CycleState key of the match found by the prefix plugin named ``name``."""
    return f"{MATCH_STATE}/{name}"


class Params(PluginParams):
    block_size_tokens: int = Field(default=16, ge=1)
    block_size: int | None = Field(default=None, ge=1)  # deprecated (v1.0): block size in characters
    auto_tune: bool = True
    max_prefix_blocks_to_match: int = Field(default=256, ge=1)
    max_prefix_tokens_to_match: int = Field(default=0, ge=0)
    lru_capacity_per_server: int = Field(default=31250, ge=1)
    # picker's options (module docstring)
    score_mode: Literal["ratio", "tokens"] = "ratio"
    saturation_tokens: int = Field(default=2048, ge=1)
    chars_per_token: float = Field(default=DEFAULT_CHARS_PER_TOKEN, gt=0.0, le=16.0)
    calibrate_tokens: bool = True
    max_load_factor: float = Field(default=0.0, ge=0.0)
    load_cap_floor: int = Field(default=1, ge=1)
    cold_spread: float = Field(default=0.0, ge=0.0, le=1.0)
    cold_spread_basis: Literal["held", "placed"] = "held"
    placed_half_life_s: float = Field(default=60.0, ge=1.0)
    cold_spread_speed_from: str = ""
    cold_spread_speed_max_tokens: int = Field(default=32, ge=1)
    cold_spread_placed_when_full: bool = False
    cold_spread_lora_fit: bool = False
    cold_spread_debt_limit: float = Field(default=0.0, ge=0.0)
    cold_spread_home: bool = False
    cold_spread_home_tokens: int = Field(default=256, ge=1)
    balance_abs_threshold: float = Field(default=0.0, ge=0.0)
    balance_rel_threshold: float = Field(default=1.1, ge=1.0)

    @field_validator("max_load_factor")
    @classmethod
    def _load_factor(cls, value: float) -> float:
        if 0.0 < value < 1.0:
            raise ValueError("must be 0 (off) or at least 1")
        return value


class PrefixMatch(NamedTuple):
    """What a prefix plugin found for one request in one cycle (a tuple: made on every cycle)."""

    blocks: Mapping[str, int]  # candidate key -> blocks it holds along the walk (absent: none)
    total_blocks: int  # the request's blocks (0: shorter than one block)
    block_chars: int  # bytes of prompt text per block
    prompt_chars: int  # bytes of the whole prompt text
    prompt_tokens: float  # estimated tokens of the whole prompt

    @property
    def cold(self) -> bool:
        """No candidate holds any of the request's blocks."""
        return not self.blocks

    def matched_fraction(self, key: str) -> float:
        if self.prompt_chars <= 0:
            return 0.0
        return min(1.0, self.blocks.get(key, 0) * self.block_chars / self.prompt_chars)

    def matched_tokens(self, key: str) -> float:
        return self.prompt_tokens * self.matched_fraction(key)

    def uncached_fractions(self, endpoints: Sequence[Endpoint]) -> list[float]:
        """1 - matched fraction for each endpoint, in order: the per-endpoint loop of load scorers, inlined."""
        blocks = self.blocks
        if not blocks or self.prompt_chars <= 0:
            return [1.0] * len(endpoints)
        per_block = self.block_chars / self.prompt_chars
        get = blocks.get
        # Most candidates hold none of the request's blocks: one dict lookup, no arithmetic.
        return [(1.0 - f if (f := n * per_block) < 1.0 else 0.0) if (n := get(e.key)) else 1.0 for e in endpoints]

    def uncached_tokens(self, key: str) -> float:
        return self.prompt_tokens - self.matched_tokens(key)


class _Blocks(NamedTuple):
    block_chars: int
    hashes: tuple[int, ...]
    prompt_chars: int


class PrefixCacheScorer:
    type: ClassVar[str] = TYPE
    category: ClassVar[Category] = Category.AFFINITY

    def __init__(self, name: str, params: Params, ctx: PluginContext | None = None) -> None:
        self.name = name
        self.params = params
        self.index = PrefixIndex(params.lru_capacity_per_server)
        self.tokens = TokenEstimator(params.chars_per_token, calibrate=params.calibrate_tokens and self._uses_tokens())
        self._ctx = ctx
        self._state_key = f"{self.type}/{name}"
        self._match_key = match_key(name)
        # Set by a peer exchange (picker.peers): told (name, endpoint key, block bytes, hashes) of every placement
        # this scorer learns from this replica's own picks.
        self.on_learn: Callable[[str, str, int, Sequence[int]], None] | None = None
        self._holders_key = f"{self._state_key}/holders"
        # New blocks placed per endpoint, fading (``coldSpreadBasis: placed``); None when the basis is ``held``.
        self._placed = (
            DecayingCounts(params.placed_half_life_s, ctx.clock)
            if ctx is not None and (params.cold_spread_basis == "placed" or params.cold_spread_placed_when_full)
            else None
        )
        self._speed: SpeedSource | None = None  # ``coldSpreadSpeedFrom``, resolved by ``bind``
        # The share of recent prompts some server held blocks of (``coldSpreadPlacedWhenFull``).
        self._hit_share = RecentShare()
        # ``coldSpreadPlacedWhenFull``: the share of recent cold prompts (every index full) that found every server
        # queueing, and the share of the servers' requests that neither picker nor its peers sent, over recent
        # cold prompts: assumed whole until the servers' reports show otherwise (~100 cold prompts).
        self._queued_share = RecentShare()
        self._foreign_share = RecentShare(start=1.0)
        # The deprecated character block size applies only when blockSizeTokens was not set explicitly.
        self._legacy_block_bytes = (
            params.block_size if params.block_size and "block_size_tokens" not in params.model_fields_set else None
        )

    def _uses_tokens(self) -> bool:
        """Whether scores depend on token counts (then the estimator calibrates from responses)."""
        return self.params.score_mode == "tokens"

    def score(self, req: InferenceRequest, endpoints: Sequence[Endpoint], cycle: CycleState) -> ScoreVector:
        match = self.match(req, endpoints, cycle)
        if not match.total_blocks:
            return ScoreVector.constant(endpoints, 0.0)
        params = self.params
        if params.cold_spread_placed_when_full:
            self._hit_share.add(not match.cold)
        if match.cold:
            if params.cold_spread <= 0.0:
                return ScoreVector.constant(endpoints, 0.0)
            home = self._home(req, endpoints, cycle) if self.gives_homes else None
            if home is not None:
                scores = [params.cold_spread if e.key == home else 0.0 for e in endpoints]
            else:
                scores = self._spread(endpoints, match)
            if params.cold_spread_lora_fit:
                _spread_where_adapter_fits(req.lora_adapter, endpoints, scores)
        else:
            counts = match.blocks
            if params.score_mode == "ratio":
                total = match.total_blocks
                scores = [counts.get(e.key, 0) / total for e in endpoints]
            else:
                scale = match.prompt_tokens / float(params.saturation_tokens)
                scores = [(x if (x := scale * (1.0 - u)) < 1.0 else 1.0) for u in match.uncached_fractions(endpoints)]
        capped, balanced = params.max_load_factor > 0.0, params.balance_abs_threshold > 0.0
        if (capped or balanced) and (loads := self._loads(endpoints)):  # read once for both rules
            if capped:  # held prefixes and new content alike: nothing onto a server past the cap (docstring)
                self._cap_hot(loads, scores)
            if balanced:
                for i in over_bound(loads, params):
                    scores[i] = 0.0
        return ScoreVector(endpoints, scores)

    def match(self, req: InferenceRequest, endpoints: Sequence[Endpoint], cycle: CycleState) -> PrefixMatch:
        """The request's match against the index; also left in ``cycle`` for later plugins."""
        counts = self.prefix_holders(req, endpoints, cycle)
        blocks: _Blocks = cycle[self._state_key]
        if counts:  # only candidates count: an endpoint filtered out does not make the request warm
            counts = {e.key: n for e in endpoints if (n := counts.get(e.key, 0))}
        found = PrefixMatch(
            counts, len(blocks.hashes), blocks.block_chars, blocks.prompt_chars, self.tokens.prompt_tokens(req)
        )
        cycle[self._match_key] = found
        cycle[MATCH_STATE] = found
        return found

    def prefix_holders(self, req: InferenceRequest, endpoints: Sequence[Endpoint], cycle: CycleState) -> dict[str, int]:
        """Every endpoint key in the index → blocks it holds along the request's walk (the large-pool pre-filter
        keeps these); computed once per cycle and block size. Do not mutate the result."""
        blocks = self._blocks(req, endpoints, cycle)
        cached = cycle.get(self._holders_key)
        if cached is not None and cached[0] is blocks:
            held: dict[str, int] = cached[1]
            return held
        held = self.index.match(blocks.hashes) if blocks.hashes else {}
        cycle[self._holders_key] = (blocks, held)
        return held

    @property
    def gives_homes(self) -> bool:
        """Whether cold prompts go to a home (``coldSpreadHome`` with a spread to give)."""
        return self.params.cold_spread_home and self.params.cold_spread > 0.0

    def cold_home(self, req: InferenceRequest, endpoints: Sequence[Endpoint], cycle: CycleState) -> str | None:
        """``coldSpreadHome``: the key of the candidate a cold prompt's spread goes to alone; None when the option
        is off, some candidate holds a block of the prompt or it is shorter than ``coldSpreadSpeedMaxTokens``."""
        if not self.gives_homes or not endpoints:
            return None
        held = self.prefix_holders(req, endpoints, cycle)
        if held and any(e.key in held for e in endpoints):
            return None
        return self._home(req, endpoints, cycle)

    def _home(self, req: InferenceRequest, endpoints: Sequence[Endpoint], cycle: CycleState) -> str | None:
        """``cold_home`` for a prompt already known cold among ``endpoints`` (its blocks are in ``cycle``)."""
        params = self.params
        if self.tokens.prompt_tokens(req) < params.cold_spread_speed_max_tokens:
            return None
        hashes: tuple[int, ...] = cycle[self._state_key].hashes
        if not hashes:
            return None
        block_tokens = self._block_sizes(endpoints[0])[0]
        anchor = hashes[min(len(hashes), -(-params.cold_spread_home_tokens // block_tokens)) - 1]
        fast = native.module
        if fast is not None:
            home: str = fast.rendezvous(anchor, endpoints)
            return home
        return rendezvous_home(anchor, endpoints)

    def pre_request(self, req: InferenceRequest, result: SchedulingResult) -> None:
        if not result.targets:
            return
        cycle = result.cycle if result.cycle is not None else CycleState()
        blocks = self._blocks(req, result.targets, cycle)
        hashes = blocks.hashes
        if not hashes:
            return
        self._learn(result.targets[0], hashes)
        announce = self.on_learn
        if announce is not None:
            announce(self.name, result.targets[0].key, blocks.block_chars, hashes)
        prefill = result.profile_results.get(PREFILL_PROFILE)
        if prefill is not None and prefill.targets and result.primary_profile != PREFILL_PROFILE:
            self._learn(prefill.targets[0], hashes)
            if announce is not None:
                announce(self.name, prefill.targets[0].key, blocks.block_chars, hashes)

    def learn_placement(self, endpoint: Endpoint, block_chars: int, hashes: Sequence[int]) -> bool:
        """Learn that another picker replica sent these blocks to ``endpoint`` (a peer exchange, docs/ha.md), as
        if this replica had. Refused (False) when the peer cut its blocks to another size than this scorer's."""
        if block_chars != self.block_chars(endpoint):
            return False
        self._learn(endpoint, hashes)
        return True

    def block_chars(self, endpoint: Endpoint) -> int:
        """Bytes of prompt text per block for a pool whose first candidate is ``endpoint``."""
        return self._block_sizes(endpoint)[1]

    def post_response(self, req: InferenceRequest, info: ResponseInfo) -> None:
        self.tokens.observe(req, info.prompt_tokens)

    def endpoints_changed(self, keys: frozenset[str]) -> None:
        self.index.retain(keys)
        if self._placed is not None:
            self._placed.retain(keys)

    def _loads(self, endpoints: Sequence[Endpoint]) -> list[float]:
        """The requests each endpoint works on (empty without a context)."""
        ctx = self._ctx
        if ctx is None or not endpoints:
            return []
        return native.server_requests(ctx, endpoints)

    def _cap_hot(self, loads: Sequence[float], scores: list[float]) -> None:
        params = self.params
        cap = max(math.ceil(params.max_load_factor * (sum(loads) + 1) / len(loads)), params.load_cap_floor)
        for i, n in enumerate(loads):
            if n + 1 > cap:
                scores[i] = 0.0

    def bind(self, plugins: Mapping[str, object], profiles: Collection[str]) -> None:
        """Resolve ``coldSpreadSpeedFrom`` (config loading)."""
        if self.params.cold_spread_speed_from:
            self._speed = resolve_speed_source(plugins, "coldSpreadSpeedFrom", self.params.cold_spread_speed_from)

    def _spread(self, endpoints: Sequence[Endpoint], match: PrefixMatch) -> list[float]:
        params = self.params
        spread = params.cold_spread
        placed = self._placed
        # Every index full: the blocks held compare equal, so count those placed lately (coldSpreadPlacedWhenFull).
        full = placed is not None and params.cold_spread_placed_when_full and self._indexes_full(endpoints)
        by_placed = placed if full or params.cold_spread_basis == "placed" else None
        if by_placed is not None:
            sizes: list[float] = [by_placed.get(e.key) for e in endpoints]
        else:
            sizes = [self.index.endpoint_blocks(e.key) for e in endpoints]
        if by_placed is not None and params.cold_spread_debt_limit > 0.0 and len(sizes) > 2:
            # What a server missed while it took little is owed only up to the limit; the rest is forgiven, so
            # once it has taken its due it waits for its turn again (module docstring).
            ordered = sorted(sizes)
            least = ordered[len(ordered) // 2] - params.cold_spread_debt_limit * match.total_blocks
            for i, n in enumerate(sizes):
                if n < least:
                    by_placed.add(endpoints[i].key, least - n)
                    sizes[i] = least
        speed = self._speed
        if speed is not None and full:
            # The blocks placed lately are the work each server took in and, for sessions, work still coming back
            # to it. A server k times slower counts them k times, in whole multiples: near the queues' jitter a
            # factor of 1.1 would reorder servers whose counts differ by a session.
            factors = speed.slowness_factors(endpoints)
            sizes = [n * math.floor(f) if f >= 2.0 else n for n, f in zip(sizes, factors, strict=True)]
        elif speed is not None and match.prompt_tokens < params.cold_spread_speed_max_tokens:
            # A prompt this short places next to no reusable cache: spreading it balances request counts, and a
            # server answering k times slower than the pool should take about 1/k of its share of them.
            factors = speed.slowness_factors(endpoints)
            sizes = [n * f if f != 1.0 else n for n, f in zip(sizes, factors, strict=True)]
        # Counted on every cold prompt, so the share is known by the time the indexes are full.
        own_pool = params.cold_spread_placed_when_full and self._own_pool(endpoints)
        sharp = False
        if full:
            # Where picker sent nearly all the work, an empty queue in a pool that holds two waiting requests per
            # server is one the round has not refilled yet, not room to spare: sending new sessions there by the
            # queue of the moment herds them onto the few servers that drained.
            queued = all(e.metrics.waiting > 0 for e in endpoints) or (
                own_pool and sum(e.metrics.waiting for e in endpoints) >= _QUEUED_MEAN_MIN * len(endpoints)
            )
            queued_share = self._queued_share.add(queued)
            # There, too, the pool is past its knee when it queued at a quarter of the recent cold prompts, not
            # only at this one: a scrape that caught one queue empty says little then, and each session sent by
            # the queue of the moment breaks the round.
            sharp = self._hit_share.value >= 0.5 and (queued or (own_pool and queued_share >= _QUEUED_SHARE_MIN))
        high = max(sizes, default=0.0)
        if high <= 0.0:
            return [spread] * len(endpoints)
        if sharp:
            # Every server queues and most prompts come back to content placed earlier (sessions, shared
            # prefixes): from the least placed (the whole spread) to the most (none), as SGLang's smallest tree,
            # so new sessions go round the pool instead of to whichever queue is shortest this instant. One-off
            # prompts return no work: for them the load scorers' view of the queues should keep its say.
            low = min(sizes)
            if own_pool:
                # Only the least placed: new sessions go round the pool strictly, as SGLang's, while the
                # others' scores would leave the load scorers to reorder servers a session apart. Not where
                # a good part of the queues is other clients' (they fill servers the round does not see).
                return [spread if s == low else 0.0 for s in sizes]
            return [spread * (high - s) / (high - low) for s in sizes] if high > low else [spread] * len(endpoints)
        return [spread * (1.0 - s / high) for s in sizes]

    def _own_pool(self, endpoints: Sequence[Endpoint]) -> bool:
        """Whether, over recent cold prompts, the servers' requests were nearly all picker's or its peers'
        (at most ``_FOREIGN_SHARE_MAX`` reported beyond them: ``serverload``'s foreign requests)."""
        ctx = self._ctx
        if ctx is None:
            return False
        total = sum(native.server_requests(ctx, endpoints))
        if total > 0.0:
            self._foreign_share.add(min(1.0, sum(native.server_foreign(ctx, endpoints)) / total))
        return self._foreign_share.value <= _FOREIGN_SHARE_MAX

    def _indexes_full(self, endpoints: Sequence[Endpoint]) -> bool:
        """picker's index holds a full KV cache's worth of blocks for every candidate (``coldSpreadPlacedWhenFull``):
        the blocks held then compare equal and say nothing."""
        if not endpoints:
            return False
        index = self.index
        return all(index.endpoint_blocks(e.key) >= _FULL_INDEX_SHARE * self._index_capacity(e) for e in endpoints)

    def _index_capacity(self, endpoint: Endpoint) -> int:
        """Blocks the index keeps for ``endpoint``: its KV size with ``autoTune`` when it reports one."""
        if self.params.auto_tune and endpoint.metrics.num_gpu_blocks:
            return endpoint.metrics.num_gpu_blocks
        return self.params.lru_capacity_per_server

    def _learn(self, endpoint: Endpoint, hashes: Sequence[int]) -> None:
        added = self.index.add(endpoint.key, hashes, self._index_capacity(endpoint))
        if self._placed is not None and added:
            self._placed.add(endpoint.key, added)

    def _block_sizes(self, first: Endpoint | None) -> tuple[int, int]:
        """(tokens, bytes) per block, auto-tuned from the first candidate's metrics."""
        chars_per_token = self.params.chars_per_token
        block_tokens = self.params.block_size_tokens
        if self.params.auto_tune and first is not None and first.metrics.block_size:
            block_tokens = first.metrics.block_size
            block_bytes = max(1, round(block_tokens * chars_per_token))
        elif self._legacy_block_bytes is not None:
            block_bytes = self._legacy_block_bytes
            block_tokens = max(1, int(block_bytes // chars_per_token))
        else:
            block_bytes = max(1, round(block_tokens * chars_per_token))
        return block_tokens, block_bytes

    def _blocks(self, req: InferenceRequest, endpoints: Sequence[Endpoint], cycle: CycleState) -> _Blocks:
        block_tokens, block_bytes = self._block_sizes(endpoints[0] if endpoints else None)
        cached = cycle.get(self._state_key)
        if cached is not None and cached.block_chars == block_bytes:
            blocks: _Blocks = cached
            return blocks
        max_blocks = self.params.max_prefix_blocks_to_match
        if self.params.max_prefix_tokens_to_match > 0:
            max_blocks = -(-self.params.max_prefix_tokens_to_match // block_tokens)
        text = req.prompt_text
        hashes = prefix_hashes(text, block_bytes, max_blocks, req.target_model, _cache_salt(req))
        # Hashing cuts UTF-8 bytes; the prompt's size is counted the same way.
        size = len(text) if text.isascii() else len(text.encode())
        blocks = _Blocks(block_bytes, hashes, size)
        cycle[self._state_key] = blocks
        return blocks


_MASK64 = (1 << 64) - 1


def rendezvous_home(anchor: int, endpoints: Sequence[Endpoint]) -> str:
    """The key of the endpoint ranking first for ``anchor`` by rendezvous (highest random weight) hashing: the
    same for every router that sees the same keys, and unchanged for a prefix whose home stays in the pool when
    other endpoints come or go. The C twin is ``_native.rendezvous`` (the one that serves when built)."""
    best_key, best = "", -1
    for e in endpoints:
        key = e.key
        h = xxhash.xxh64_intdigest(key.encode())
        # splitmix64's finalizer over anchor ^ key: a full 64-bit mix, so neighbouring keys rank independently.
        z = ((anchor ^ h) + 0x9E3779B97F4A7C15) & _MASK64
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
        z ^= z >> 31
        if z > best or (z == best and key < best_key):
            best_key, best = key, z
    return best_key


def _spread_where_adapter_fits(adapter: str, endpoints: Sequence[Endpoint], scores: list[float]) -> None:
    """``coldSpreadLoraFit``: no spread on a server the request's adapter does not fit, when one it fits exists
    and some server runs or loads the adapter (so it is one: a base-model name is in no server's adapter lists)."""
    if not any(adapter in e.metrics.running_loras or adapter in e.metrics.waiting_loras for e in endpoints):
        return
    fits = [adapter_fits(e.metrics, adapter) for e in endpoints]
    if any(fits):
        for i, fit in enumerate(fits):
            if not fit:
                scores[i] = 0.0


def over_bound(loads: Sequence[float], params: Params) -> list[int]:
    """The positions of the endpoints more than ``balanceAbsThreshold`` requests and more than
    ``balanceRelThreshold`` times ahead of the least busy one. Both must hold, as in SGLang: the absolute margin
    keeps a pool at low load from tripping on noise, the relative one a pool at high load."""
    low = min(loads)
    abs_bound = low + params.balance_abs_threshold
    rel_bound = low * params.balance_rel_threshold
    return [i for i, n in enumerate(loads) if n > abs_bound and n > rel_bound]


def _cache_salt(req: InferenceRequest) -> str:
    doc = req.body_json
    if doc is None:
        return ""
    salt = doc.get("cache_salt")
    return salt if isinstance(salt, str) else ""


def create(name: str, params: Params, ctx: PluginContext) -> Scorer:
    return PrefixCacheScorer(name, params, ctx)


SPEC = PluginSpec(TYPE, Params, create)
