"""prefix-cache-scorer: prefer endpoints that were recently sent the same prompt prefix (approximate).

Type ``prefix-cache-scorer`` (Affinity). Inputs: the request's prompt text and target model (and body
``cache_salt``); the index of what picker itself sent where (``prefix_index``). Score for an endpoint: the
blocks it holds along the request's prefix walk ÷ the request's blocks (partial tail block included); a prompt
shorter than one block scores 0 everywhere.

Learning (PreRequest): the request's hashes are added to the primary target and to the ``prefill`` profile's
target, if any. Nothing is learned from real cache events (that is ``precise-prefix-cache-scorer``). Endpoints
that leave the pool are purged (``endpoints_changed``).

Parameters (reference names and defaults):
``blockSizeTokens`` 16 (block = x4 characters); ``autoTune`` true (block size from the first candidate's
``block_size`` metric, LRU capacity from its ``num_gpu_blocks``); ``maxPrefixBlocksToMatch`` 256;
``maxPrefixTokensToMatch`` 0 (> 0 overrides the block limit); ``lruCapacityPerServer`` 31250 blocks;
``blockSize`` (deprecated, characters; used when ``blockSizeTokens`` is not given).
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
    SchedulingResult,
)
from picker.scheduling.framework import Scorer
from picker.scheduling.plugins.prefix_index import PrefixIndex, prefix_hashes
from picker.scheduling.scores import ScoreVector
from picker.scheduling.spec import PluginSpec

__all__ = ["SPEC", "TYPE", "Params", "PrefixCacheScorer", "create"]

TYPE = "prefix-cache-scorer"
CHARS_PER_TOKEN = 4
PREFILL_PROFILE = "prefill"


class Params(PluginParams):
    block_size_tokens: int = Field(default=16, ge=1)
    block_size: int | None = Field(default=None, ge=1)  # deprecated (v1.0): block size in characters
    auto_tune: bool = True
    max_prefix_blocks_to_match: int = Field(default=256, ge=1)
    max_prefix_tokens_to_match: int = Field(default=0, ge=0)
    lru_capacity_per_server: int = Field(default=31250, ge=1)


class PrefixCacheScorer:
    type: ClassVar[str] = TYPE
    category: ClassVar[Category] = Category.AFFINITY

    def __init__(self, name: str, params: Params) -> None:
        self.name = name
        self.params = params
        self.index = PrefixIndex(params.lru_capacity_per_server)
        self._state_key = f"{TYPE}/{name}"
        # The deprecated character block size applies only when blockSizeTokens was not set explicitly.
        self._legacy_block_bytes = (
            params.block_size if params.block_size and "block_size_tokens" not in params.model_fields_set else None
        )

    def score(self, req: InferenceRequest, endpoints: Sequence[Endpoint], cycle: CycleState) -> ScoreVector:
        hashes = self._hashes(req, endpoints, cycle)
        if not hashes:
            return ScoreVector.constant(endpoints, 0.0)
        counts = self.index.match(hashes)
        total = len(hashes)
        return ScoreVector(endpoints, [counts.get(e.key, 0) / total for e in endpoints])

    def pre_request(self, req: InferenceRequest, result: SchedulingResult) -> None:
        if not result.targets:
            return
        cycle = result.cycle if result.cycle is not None else CycleState()
        hashes = self._hashes(req, result.targets, cycle)
        if not hashes:
            return
        self._learn(result.targets[0], hashes)
        prefill = result.profile_results.get(PREFILL_PROFILE)
        if prefill is not None and prefill.targets and result.primary_profile != PREFILL_PROFILE:
            self._learn(prefill.targets[0], hashes)

    def endpoints_changed(self, keys: frozenset[str]) -> None:
        self.index.retain(keys)

    def _learn(self, endpoint: Endpoint, hashes: Sequence[int]) -> None:
        capacity = endpoint.metrics.num_gpu_blocks if self.params.auto_tune else None
        self.index.add(endpoint.key, hashes, capacity)

    def _hashes(self, req: InferenceRequest, endpoints: Sequence[Endpoint], cycle: CycleState) -> tuple[int, ...]:
        block_tokens = self.params.block_size_tokens
        if self.params.auto_tune and endpoints and endpoints[0].metrics.block_size:
            block_tokens = endpoints[0].metrics.block_size
            block_bytes = block_tokens * CHARS_PER_TOKEN
        elif self._legacy_block_bytes is not None:
            block_bytes = self._legacy_block_bytes
            block_tokens = max(1, block_bytes // CHARS_PER_TOKEN)
        else:
            block_bytes = block_tokens * CHARS_PER_TOKEN
        cached = cycle.get(self._state_key)
        if cached is not None and cached[0] == block_bytes:
            hashes: tuple[int, ...] = cached[1]
            return hashes
        max_blocks = self.params.max_prefix_blocks_to_match
        if self.params.max_prefix_tokens_to_match > 0:
            max_blocks = -(-self.params.max_prefix_tokens_to_match // block_tokens)
        hashes = prefix_hashes(req.prompt_text, block_bytes, max_blocks, req.target_model, _cache_salt(req))
        cycle[self._state_key] = (block_bytes, hashes)
        return hashes


def _cache_salt(req: InferenceRequest) -> str:
    doc = req.body_json
    if doc is None:
        return ""
    salt = doc.get("cache_salt")
    return salt if isinstance(salt, str) else ""


def create(name: str, params: Params, ctx: PluginContext) -> Scorer:
    return PrefixCacheScorer(name, params)


SPEC = PluginSpec(TYPE, Params, create)
