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

picker's options, all off by default so the reference behaviour is unchanged:

* ``scoreMode`` ``ratio`` (reference) | ``tokens``: score = min(1, matched_tokens / ``saturationTokens`` (2048)),
  matched_tokens = P * min(1, matched_blocks * block_chars / prompt_chars), P the prompt's tokens from a
  ``TokenEstimator`` calibrated on responses' usage (``calibrateTokens`` true), so a short prompt matched whole
  scores less than a long one (the ratio's defect, GIE #2561). ``charsPerToken`` 4: characters per token.
* ``coldSpread`` 0 (off; ≤ 1): a request whose blocks no candidate holds scores
  coldSpread * (1 - blocks_e / max_c blocks_c), blocks_e the index's blocks for e capped at e's KV size, so new
  prefixes go to the endpoint with the least cached content (SGLang's smallest tree); once every cache is full
  they compare equal and the other scorers decide.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import ClassVar, Literal, NamedTuple

from pydantic import Field

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
from picker.scheduling.framework import Scorer
from picker.scheduling.plugins.prefix_index import PrefixIndex, prefix_hashes
from picker.scheduling.scores import ScoreVector
from picker.scheduling.spec import PluginSpec
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
]

TYPE = "prefix-cache-scorer"
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
    cold_spread: float = Field(default=0.0, ge=0.0, le=1.0)


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
        self._state_key = f"{self.type}/{name}"
        self._match_key = match_key(name)
        # Set by a peer exchange (picker.peers): told (name, endpoint key, block bytes, hashes) of every placement
        # this scorer learns from this replica's own picks.
        self.on_learn: Callable[[str, str, int, Sequence[int]], None] | None = None
        self._holders_key = f"{self._state_key}/holders"
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
        if match.cold:
            if params.cold_spread <= 0.0:
                return ScoreVector.constant(endpoints, 0.0)
            scores = self._spread(endpoints)
        else:
            counts = match.blocks
            if params.score_mode == "ratio":
                total = match.total_blocks
                scores = [counts.get(e.key, 0) / total for e in endpoints]
            else:
                scale = match.prompt_tokens / float(params.saturation_tokens)
                scores = [(x if (x := scale * (1.0 - u)) < 1.0 else 1.0) for u in match.uncached_fractions(endpoints)]
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

    def _spread(self, endpoints: Sequence[Endpoint]) -> list[float]:
        spread = self.params.cold_spread
        sizes = [self.index.endpoint_blocks(e.key) for e in endpoints]
        high = max(sizes, default=0)
        if high <= 0:
            return [spread] * len(endpoints)
        return [spread * (1.0 - s / high) for s in sizes]

    def _index_capacity(self, endpoint: Endpoint) -> int:
        """Blocks the index keeps for ``endpoint``: its KV size with ``autoTune`` when it reports one."""
        if self.params.auto_tune and endpoint.metrics.num_gpu_blocks:
            return endpoint.metrics.num_gpu_blocks
        return self.params.lru_capacity_per_server

    def _learn(self, endpoint: Endpoint, hashes: Sequence[int]) -> None:
        self.index.add(endpoint.key, hashes, self._index_capacity(endpoint))

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


def _cache_salt(req: InferenceRequest) -> str:
    doc = req.body_json
    if doc is None:
        return ""
    salt = doc.get("cache_salt")
    return salt if isinstance(salt, str) else ""


def create(name: str, params: Params, ctx: PluginContext) -> Scorer:
    return PrefixCacheScorer(name, params, ctx)


SPEC = PluginSpec(TYPE, Params, create)
