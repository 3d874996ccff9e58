"""precise-prefix-cache-scorer: prefer endpoints whose KV cache holds the request's prefix, from the servers' own
KV-cache events (llm-d's scorer, scheduling.md §5).

Type ``precise-prefix-cache-scorer`` (Affinity). Inputs: the request's token ids (``InferenceRequest.token_ids``,
attached before scheduling by the token source: the model server's ``/tokenize``, see ``token-producer``), the
candidates' block size (scraped ``block_size``, else ``tokenProcessorConfig.blockSize``) and the KV-block index
(``picker.kvcache``) that the KV-event subscriber (``picker.kvevents``, started by ``picker serve`` for every
scorer of this type) keeps up to date.

Score for an endpoint: the request's block keys (``keys.block_keys``: full blocks of the server's block size,
model or LoRA adapter in the root, the hash seed) walked from the first; the endpoint's run of consecutive held
blocks, each weighted by its best tier (``gpu`` 1.0, ``cpu`` 0.8), ÷ the request's blocks, capped at 1. A
prompt shorter than one block scores 0.

No tokens (the tokenizer failed, timed out or is not configured): *fail open* to the approximate index — the
scorer keeps a ``prefix-cache-scorer`` of its own (``fallback``), taught on every pick, and scores with it;
``picker_precise_prefix_scores_total{source="approximate"}`` counts those requests.

Speculative indexing (``speculativeIndexing``): PreRequest marks the request's blocks as held by the chosen
endpoint (and the ``prefill`` profile's) for ``speculativeTTL``, unless a ``BlockStored`` confirms them first, so a
burst of one prefix does not scatter before the server's events arrive.

Parameters (llm-d's names): ``tokenProcessorConfig`` {``blockSize`` (or ``blockSizeTokens``) 16, ``hashSeed``
""}; ``kvEventsConfig`` {``topicFilter`` "kv@", ``discoverPods`` true, ``podDiscoveryConfig`` {``socketPort``
5557}, ``zmqEndpoint`` "" (central mode: bind there), ``concurrency``, ``engineType`` (accepted)};
``indexerConfig`` {``kvBlockIndexConfig.inMemoryConfig.size`` (entries, default 4 000 000 here),
``kvBlockScorerConfig.backendConfigs`` [{``name``, ``weight``}]}; ``speculativeIndexing`` false,
``speculativeTTL`` 2s. picker's: ``autoTune`` true (block size from the scraped metric),
``maxPrefixBlocksToMatch`` 512, ``podDiscoveryConfig.replaySocketPort`` 0 (vLLM's replay ROUTER port; 0: none),
``kvEventsConfig.queueSize`` 10 000 (messages the socket holds; beyond that the publisher drops, the subscriber
sees a gap and resyncs), ``fallback`` "approximate" | "none", ``approximate`` (a ``prefix-cache-scorer``'s
parameters for the fallback).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from picker.kvcache.index import DEFAULT_TIER_WEIGHTS, KVBlockIndex
from picker.kvcache.keys import hash_seed_value
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
from picker.scheduling import units
from picker.scheduling.framework import Scorer
from picker.scheduling.plugins import prefix
from picker.scheduling.scores import ScoreVector
from picker.scheduling.spec import PluginSpec
from picker.telemetry import kvmetrics

__all__ = [
    "SPEC",
    "TYPE",
    "IndexerConfig",
    "KVEventsConfig",
    "Params",
    "PodDiscoveryConfig",
    "PrecisePrefixCacheScorer",
    "TokenProcessorConfig",
    "create",
]

TYPE = "precise-prefix-cache-scorer"
PREFILL_PROFILE = "prefill"


class TokenProcessorConfig(PluginParams):
    block_size: int = Field(default=16, ge=1, le=65536)
    block_size_tokens: int | None = Field(default=None, ge=1, le=65536)  # the newer name of blockSize
    hash_seed: str = ""

    @field_validator("hash_seed", mode="before")
    @classmethod
    def _seed_text(cls, value: Any) -> Any:
        return str(value) if isinstance(value, int) and not isinstance(value, bool) else value

    @property
    def tokens_per_block(self) -> int:
        return self.block_size_tokens if self.block_size_tokens is not None else self.block_size


class PodDiscoveryConfig(PluginParams):
    socket_port: int = Field(default=5557, ge=1, le=65535)
    pod_label_selector: str = "llm-d.ai/inference-serving=true"  # accepted: picker's pods are the pool's
    replay_socket_port: int = Field(default=0, ge=0, le=65535)  # picker's: vLLM's replay ROUTER (0: none)


class KVEventsConfig(PluginParams):
    topic_filter: str = "kv@"
    concurrency: int = Field(default=4, ge=1)  # accepted: one ordered stream per endpoint already
    discover_pods: bool = True
    pod_discovery_config: PodDiscoveryConfig = Field(default_factory=PodDiscoveryConfig)
    zmq_endpoint: str = ""
    engine_type: str = "vllm"
    queue_size: int = Field(default=10_000, ge=1)  # picker's: the SUB socket's high-water mark


class _InMemory(PluginParams):
    size: int = Field(default=4_000_000, ge=1)
    pod_cache_size: int = Field(default=10, ge=1)  # accepted


class _BlockIndexConfig(PluginParams):
    in_memory_config: _InMemory = Field(default_factory=_InMemory)
    enable_metrics: bool = True


class _Backend(PluginParams):
    name: str
    weight: float = Field(ge=0.0, le=1.0)


class _ScorerConfig(PluginParams):
    backend_configs: tuple[_Backend, ...] = tuple(_Backend(name=n, weight=w) for n, w in DEFAULT_TIER_WEIGHTS.items())

    @field_validator("backend_configs")
    @classmethod
    def _tiers(cls, value: tuple[_Backend, ...]) -> tuple[_Backend, ...]:
        if not 1 <= len(value) <= 3 or len({b.name.lower() for b in value}) != len(value):
            raise ValueError("1 to 3 backends with distinct names")
        return value


class IndexerConfig(PluginParams):
    kv_block_index_config: _BlockIndexConfig = Field(default_factory=_BlockIndexConfig)
    kv_block_scorer_config: _ScorerConfig = Field(default_factory=_ScorerConfig)


class Params(PluginParams):
    token_processor_config: TokenProcessorConfig = Field(default_factory=TokenProcessorConfig)
    kv_events_config: KVEventsConfig = Field(default_factory=KVEventsConfig)
    indexer_config: IndexerConfig = Field(default_factory=IndexerConfig)
    speculative_indexing: bool = False
    speculative_ttl: float = Field(default=2.0, alias="speculativeTTL")
    # picker's
    auto_tune: bool = True
    max_prefix_blocks_to_match: int = Field(default=512, ge=1)
    fallback: Literal["approximate", "none"] = "approximate"
    approximate: prefix.Params = Field(default_factory=prefix.Params)

    @field_validator("speculative_ttl", mode="before")
    @classmethod
    def _ttl(cls, value: Any) -> float:
        return units.duration_s(value)

    @model_validator(mode="after")
    def _topology(self) -> Params:
        events = self.kv_events_config
        if not events.discover_pods and not events.zmq_endpoint:
            raise ValueError("kvEventsConfig needs discoverPods or a zmqEndpoint to bind")
        return self


class PrecisePrefixCacheScorer:
    type: ClassVar[str] = TYPE
    category: ClassVar[Category] = Category.AFFINITY

    def __init__(self, name: str, params: Params, ctx: PluginContext) -> None:
        self.name = name
        self.params = params
        self._ctx = ctx
        tiers = {b.name.lower(): b.weight for b in params.indexer_config.kv_block_scorer_config.backend_configs}
        self.index = KVBlockIndex(
            max_blocks=params.indexer_config.kv_block_index_config.in_memory_config.size,
            tier_weights=tiers,
            hash_seed=hash_seed_value(params.token_processor_config.hash_seed),
        )
        self.fallback = prefix.PrefixCacheScorer(f"{name}/approximate", params.approximate, ctx)
        self._keys_state = f"{TYPE}/{name}/keys"
        self._block_size = params.token_processor_config.tokens_per_block
        self._counts = kvmetrics.ScoreSources(name)

    # -- scoring ----------------------------------------------------------------------------------------------

    def score(self, req: InferenceRequest, endpoints: Sequence[Endpoint], cycle: CycleState) -> ScoreVector:
        if req.token_ids is None:
            if self.params.fallback == "approximate":
                self._counts.approximate.inc()
                return self.fallback.score(req, endpoints, cycle)
            self._counts.none.inc()
            return ScoreVector.constant(endpoints, 0.0)
        self._counts.precise.inc()
        self.index.expire(self._ctx.clock())
        scores = [0.0] * len(endpoints)
        blocks: dict[str, int] = {}
        total_blocks, unit = 0, self._block_size
        for block_size, members in self._by_block_size(endpoints).items():
            keys = self._keys(req, block_size, cycle)
            if not keys:
                continue
            matched = self.index.match(keys, (endpoints[i].key for i in members))
            total = float(len(keys))
            total_blocks, unit = len(keys), block_size
            for i in members:
                got = matched.get(endpoints[i].key)
                if got:
                    scores[i] = min(1.0, got / total)
                    blocks[endpoints[i].key] = round(got)
        # The match for later plugins of the cycle (no-hit-lru, token-load, ...), in tokens: a block is
        # ``unit`` tokens of a prompt of len(token_ids) tokens.
        n_tokens = len(req.token_ids)
        found = prefix.PrefixMatch(blocks, total_blocks, unit, n_tokens, float(n_tokens))
        cycle[prefix.match_key(self.name)] = found
        cycle[prefix.MATCH_STATE] = found
        return ScoreVector(endpoints, scores)

    def pre_request(self, req: InferenceRequest, result: SchedulingResult) -> None:
        if not result.targets:
            return
        self.fallback.pre_request(req, result)  # the fallback stays warm for the requests without tokens
        if not self.params.speculative_indexing or req.token_ids is None:
            return
        chosen = [result.targets[0]]
        prefill = result.profile_results.get(PREFILL_PROFILE)
        if prefill is not None and prefill.targets and result.primary_profile != PREFILL_PROFILE:
            chosen.append(prefill.targets[0])
        cycle = result.cycle if result.cycle is not None else CycleState()
        expires_at = self._ctx.clock() + self.params.speculative_ttl
        for endpoint in chosen:
            keys = self._keys(req, self._block_size_of(endpoint), cycle)
            self.index.speculate(endpoint.key, keys, expires_at)

    def post_response(self, req: InferenceRequest, info: ResponseInfo) -> None:
        self.fallback.post_response(req, info)

    def endpoints_changed(self, keys: frozenset[str]) -> None:
        self.index.retain(keys)
        self.fallback.endpoints_changed(keys)

    # -- keys -------------------------------------------------------------------------------------------------

    def _block_size_of(self, endpoint: Endpoint) -> int:
        if self.params.auto_tune and endpoint.metrics.block_size:
            return endpoint.metrics.block_size
        return self._block_size

    def _by_block_size(self, endpoints: Sequence[Endpoint]) -> dict[int, list[int]]:
        groups: dict[int, list[int]] = {}
        for i, e in enumerate(endpoints):
            groups.setdefault(self._block_size_of(e), []).append(i)
        return groups

    def _keys(self, req: InferenceRequest, block_size: int, cycle: CycleState) -> list[int]:
        cached: dict[int, list[int]] | None = cycle.get(self._keys_state)
        if cached is None:
            cached = cycle[self._keys_state] = {}
        keys = cached.get(block_size)
        if keys is None:
            tokens = req.token_ids or ()
            keys = cached[block_size] = self.index.request_keys(
                tokens, block_size, req.target_model, self.params.max_prefix_blocks_to_match
            )
        return keys


def create(name: str, params: Params, ctx: PluginContext) -> Scorer:
    return PrecisePrefixCacheScorer(name, params, ctx)


SPEC = PluginSpec(TYPE, Params, create)
