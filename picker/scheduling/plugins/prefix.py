"""prefix-cache-scorer: prefer endpoints that were recently sent the same prompt prefix (approximate).

Type ``prefix-cache-scorer`` (Affinity). Inputs: the request's prompt text and target model (and body
``cache_salt``); the index of what picker itself sent where (``prefix_index``). Score for an endpoint: the
blocks it holds along the request's prefix walk ÷ the request's blocks (partial tail block included); a prompt
shorter than one block scores 0 everywhere.

Learning (PreRequest): the request's hashes are added to the primary target and to the ``prefill`` profile's
target, if any. With a peer exchange between picker replicas (docs/ha.md) each placement is also announced to the
other replicas (``on_learn``), which learn it as their own (``learn_placement``).
Nothing is learned from real cache events (that is ``precise-prefix-cache-scorer``). Endpoints
that leave the pool are purged (``endpoints_changed``). Each cycle's match is left in the ``CycleState`` as a
``PrefixMatch`` (under ``match_key(name)`` and ``MATCH_STATE``) for later plugins of the cycle
(``no-hit-lru-scorer``, ``token-load-scorer``, ``picker-load-scorer``).

Parameters (reference names and defaults):
``blockSizeTokens`` 16 (block = x4 characters); ``autoTune`` true (block size from the first candidate's
``block_size`` metric, LRU capacity from its ``num_gpu_blocks``); ``maxPrefixBlocksToMatch`` 256;
``maxPrefixTokensToMatch`` 0 (> 0 overrides the block limit); ``lruCapacityPerServer`` 31250 blocks;
``blockSize`` (deprecated, characters; used when ``blockSizeTokens`` is not given).

picker's options (all off by default, so the reference behaviour is unchanged):

* ``scoreMode`` ``ratio`` (reference) | ``tokens``: score = min(1, matched_tokens / ``saturationTokens``)
  (default 2048), with matched_tokens = P * min(1, matched_blocks * block_chars / prompt_chars) and P the
  prompt's tokens from a ``TokenEstimator`` calibrated on responses' usage (``calibrateTokens`` true). A short
  prompt matched whole no longer scores like a long one (the ratio's defect, GIE #2561).
* ``charsPerToken`` 4: characters per token of a block (block = ``blockSizeTokens`` * this).
* ``maxLoadFactor`` 0 (off; else ≥ 1): hot-prefix cap, bounded-load style. With n_e the requests e is working
  on (``PluginContext.server_load``: picker's in-flight requests plus what the server last reported beyond
  them, so traffic picker did not route counts; picker's ledger alone when it is the only client) and N
  candidates, an endpoint with n_e + 1 > max(ceil(maxLoadFactor * (Σn + 1) / N), ``loadCapFloor``)
  scores 0: the request goes elsewhere on load, and the prefix is learned there too (the hot prefix replicates).
  ``loadCapFloor`` 1 keeps pure bounded loads, which already spread at low load; raise it to keep affinity until
  an endpoint has that many requests in flight. The cap holds for the cold spread as well (below): a server past
  it gets none of it. The server with the least content (one back from a slow spell, or just added) otherwise
  took every new prefix until its cache had caught up: a server 15x slower for 70 s took 191 of the ~200
  requests of a 10 s window after it recovered (p90 TTFT of the 30 s after 80-85 ms, least connections 59), and
  with the cap 60-72 (59 ms).
* ``coldSpread`` 0 (off; ≤ 1): a request whose blocks no endpoint holds scores
  coldSpread * (1 - blocks_e / max_c blocks_c), blocks_e being the blocks picker has placed on e (all equal ⇒
  coldSpread): new prefixes go to the endpoint with the least cached content (SGLang's smallest tree).
* ``coldSpreadBasis`` ``held`` (default) | ``placed``: what blocks_e counts. ``held``: the blocks the index holds
  for e, which its LRU caps at e's KV size, so once every server's cache is full (a busy pool) all are equal and
  the spread says nothing. ``placed``: the blocks picker placed on e that e did not hold yet (what SGLang's tree
  grows by), fading with a half-life of ``placedHalfLifeS`` (60 s; ≥ 1 s), so cold prompts keep being spread by
  the new content each server has had to take in lately, however full the caches (session traffic far past the
  knee: multi-turn 80 req/s 3.8 → 3.1 s p90 in the lab; it costs elsewhere, so it is not the default).
* ``coldSpreadSpeedFrom`` "" (off) names a plugin that rates each server's speed against the pool (a
  ``relative-ttft-scorer``: 1 within its tolerance, k for k times slower); ``coldSpreadSpeedMaxTokens`` 32 (≥ 1;
  two of vLLM's 16-token blocks). A cold prompt shorter than that leaves at most one full block to reuse, so its
  spread only balances request counts: each server's blocks_e counts times its factor, and a server answering 2x
  slower than the pool takes about half its share of them. Longer prompts are spread by content alone: their
  spread decides where a prefix will be cached, and a server that is slow only because it is busy now should not
  lose it (weighing every prompt cost 5-11 % on multi-turn in the lab). Without it, the spread hands a slow server
  its full share of short requests whatever its TTFT penalty (the lab's slow-server short-long 400 req/s: 154 ms
  p90 against least connections' 107; with it 104). picker's default names its ``relative-ttft-scorer``.
* ``coldSpreadPlacedWhenFull`` false: once picker's index holds 90 % of a full KV cache's worth of blocks (the
  ``num_gpu_blocks`` metric with ``autoTune``, else ``lruCapacityPerServer``) for every candidate, the blocks held
  compare equal and say nothing, so the spread counts the blocks placed lately (as ``placed`` above, fading with
  ``placedHalfLifeS``), each server's times its slowness factor (``coldSpreadSpeedFrom``) in whole multiples: 1
  below 2x, so the jitter of busy queues never reorders servers a session apart. When, besides, every candidate
  reports requests waiting and at least half of the recent prompts (a moving average over about 50) found blocks
  on some server, the spread is sharp: coldSpread * (max - blocks_e) / (max - min), the least placed server
  scoring the whole spread. Sessions and shared prefixes come back to where they were placed, so what a server
  took in is work still to come, and a new session should go round the pool (SGLang's smallest tree) rather than
  to whichever queue is shortest this instant; one-off prompts bring nothing back, and for them the load scorers'
  view of the queues keeps its say (the lab's numbers: docs/scheduling.md); a slow server takes its share of new
  sessions unless it answers 2x slower. picker's default turns it on. The hit
  share is each picker's own: with several independent replicas and no peer exchange each sees a session's
  turns that another routed as cold.
  Where the servers' requests are nearly all picker's and its peers' (at most 10 % reported beyond them: a moving
  average over recent cold prompts that starts at "all others'", so it takes ~100 of them to get there), the
  sharp spread goes to the least placed server alone (the others score none of it, so the load scorers cannot
  reorder servers a session apart), and it needs every server queueing at a quarter of the recent cold prompts
  with every index full, not at this very one: far past the knee a scrape that caught one queue empty says
  little. New sessions then go round the pool as SGLang's. There the pool also counts as queueing when its servers
  report two requests waiting each on average, one queue empty or not: such a pool would fill that queue many
  times over, and sending new sessions to the servers that drained this instant herds them onto a few, each
  coming back for its next turns. Where
  others fill a good part of the queues (bypassing clients, independent replicas) they fill servers the round
  does not see, and the queues of this moment keep their say as before.
* ``coldSpreadDebtLimit`` 0 (off; ≥ 0): where the spread counts blocks placed lately (``placed``, or
  ``coldSpreadPlacedWhenFull`` with every index full), a candidate is owed at most this many times the cold
  prompt's blocks below the candidates' median: whatever it missed beyond that is forgiven (its count is raised
  to the limit), so it takes its due and then waits for its turn again. A server that took little for a while
  (shunned as slow, just added to the pool, back from a restart) was otherwise the least placed by far, and the
  sharp spread sent it every new session until it had caught up: a round of debt paid at once (the lab's
  slow-server multi-turn 40 req/s: 55 requests in 8 s to the 2.5x slower server, first tokens up to 12 s late).
  One prompt is the turn a server waits for in an orderly round, so a limit of 1 leaves a round as it was.
  picker's default sets 1.
* ``coldSpreadLoraFit`` false: a cold prompt for a LoRA adapter (one some candidate runs or has waiting) gets
  no spread on a server where the adapter neither runs nor has a free slot (fewer distinct running-or-waiting
  adapters than ``max_lora``: lora-affinity-scorer's 1.0 and 0.8), as long as one where it fits is a candidate.
  There the request would wait for another adapter's requests to drain and that adapter to be unloaded; the
  spread weighs 3 to LoRA affinity's 1 in picker's default, so it sent an adapter's new prompts onto servers
  busy with another adapter, splitting adapters over servers with one slot. A base-model request is in no
  server's adapter lists and is spread as before. picker's default turns it on.
* ``coldSpreadHome`` false: a cold prompt of at least ``coldSpreadSpeedMaxTokens`` tokens scores the spread on
  one candidate only, its home: the candidate whose key ranks first for the prompt's first
  ``coldSpreadHomeTokens`` tokens (256, ≥ 1; the block hash there, or the last full block's of a shorter prompt)
  by rendezvous hashing. Every picker computes the same home for the same prefix without telling each other, so
  routers that cannot exchange placements (separate gateways or clusters in front of one pool, replicas without
  the peer exchange of docs/ha.md) send a system prompt or a conversation each routed alone to the same server
  rather than each to its own least placed one. It gives up the spread's balance: homes fall where the hash puts
  them (a ``maxLoadFactor`` cap still takes a server past it out), and where each conversation stays with one
  router anyway that costs more than it saves (docs/scheduling.md, "Tried in a third session of 2026-12-06";
  off in picker's default). The large-pool pre-filter keeps the home among the candidates it scores. Ranking costs
  a hash per candidate per cold prompt (12 µs at 1,024 candidates in C, 0.4 ms in Python); not with the peer
  exchange, whose replicas know each other's placements (a cold prompt is then new to the whole pool, and the
  spread balances it better).
* ``balanceAbsThreshold`` 0 (off; else requests > 0) and ``balanceRelThreshold`` 1.1 (≥ 1): bounded imbalance,
  after SGLang's cache-aware router (which routes on load alone once max n - min n > abs and max n > rel * min n).
  Here it is the endpoint, not the pool, that is tested: with n_e as for the cap and m the least n among the
  candidates, an endpoint with n_e - m > balanceAbsThreshold and n_e > balanceRelThreshold * m scores 0 (no
  affinity, no spread), so the request goes where the load scorers send it among the endpoints not that far
  ahead. The cap above compares with the mean and waits for 3x; this compares with the least busy server and
  acts as soon as one is far behind (a session workload far past the knee, where every holder is busy and
  the affinity would keep feeding it). Only this scorer's score changes: an adapter's affinity (LoRA) still
  counts, so adapters are not split, and the match is still left in the cycle, so the load scorers still
  count the prefill a holder would save. Off by default: in the policy lab no setting helped (each moved
  sessions off their cached server; docs/scheduling.md, "The tie-break and the imbalance rule").
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
            # queue of the moment herds them onto the few servers that drained (plain multi-turn 80 req/s).
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
