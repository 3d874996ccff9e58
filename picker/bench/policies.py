"""Routing policies for the policy lab: picker's scheduler (any EndpointPickerConfig) and the baselines.

A policy chooses one endpoint among the candidates for a parsed request. The lab owns the in-flight accounting
(the ``InflightTracker`` in the ``PluginContext``, updated on pick, first token and completion exactly as the
director does), so every policy reads the same router-tracked load:

* ``rr`` round robin over the candidates (by key);
* ``lc`` (``least-request``) least connections: fewest router-tracked in-flight requests, random tie-break;
* ``random`` uniform;
* ``p2c`` power of two choices: two distinct random candidates, the one with fewer in-flight requests;
* ``envoy-least-request`` Envoy's ``LEAST_REQUEST`` with equal weights (``N_CHOICES``, ``choice_count`` 2): two
  draws *with replacement* (both may be the same host), the second kept only if it has strictly fewer active
  requests than the first;
* ``cache-aware`` SGLang's router policy (scheduling.md §10): imbalanced when ``max - min > balance_abs`` and
  ``max > min x balance_rel`` (in-flight) ⇒ least loaded; else the longest character-prefix match if its share
  of the prompt exceeds ``cache_threshold``, else the worker with the smallest tree; the prompt is inserted into
  the chosen worker's tree either way. The radix tree is approximated by a per-worker set of chained hashes of
  64-character blocks; every ``eviction_interval_s`` each worker is trimmed (LRU) to ``max_tree_chars``.
  Defaults are ``CacheAwareConfig::default()``: 0.5, 32, 1.1, 30 s, 10 000 characters.
* ``lmetric`` the LMetric product: uncached prompt tokens x (in-flight + 1), lowest wins; the uncached part is
  estimated from the same kind of per-worker prefix-hash set, bounded by the endpoint's KV size.
* ``reference`` picker's scheduler with the reference default configuration (queue 2, KV 2, prefix 3);
  ``picker`` picker's scheduler with its built-in default (``load_config(None)``); ``picker-v1`` its first
  default (prefix 3 + token load 2 + LoRA 1 on picker's own ledger only; pinned, ``PREVIOUS_CONFIG_TEXT``);
  ``config:PATH`` picker's scheduler with any EndpointPickerConfig file, user plugins (``module:Class``) included.

Scheduler policies are the production ``Scheduler``; ``routed`` and ``completed`` call its ``pre_request`` and
``post_response`` hooks as the director does.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar, Protocol

import xxhash

from picker.endpoints.model import Endpoint
from picker.request.model import InferenceRequest
from picker.scheduling import Scheduler, load_config, load_config_file
from picker.scheduling.framework import PluginContext, ResponseInfo, SchedulingResult

__all__ = [
    "BASELINES",
    "POLICY_NAMES",
    "PREVIOUS_CONFIG_TEXT",
    "REFERENCE_CONFIG_TEXT",
    "CacheAware",
    "EnvoyLeastRequest",
    "LMetric",
    "LeastConnections",
    "Pick",
    "Policy",
    "PowerOfTwo",
    "PrefixSets",
    "RandomPolicy",
    "RoundRobin",
    "SchedulerPolicy",
    "make_policy",
]

# The scheduling part of the reference chart's default-plugins.yaml (scheduling.md §2; its data-layer entries
# change nothing here): pinned so the lab keeps measuring it even if picker's own default changes.
REFERENCE_CONFIG_TEXT = """\
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: queue-scorer
- type: kv-cache-utilization-scorer
- type: prefix-cache-scorer
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: queue-scorer
    weight: 2
  - pluginRef: kv-cache-utilization-scorer
    weight: 2
  - pluginRef: prefix-cache-scorer
    weight: 3
"""


# picker's first built-in default (``picker-v1``): pinned so the lab keeps comparing the current default with it.
# Its load term reads only picker's own in-flight ledger.
PREVIOUS_CONFIG_TEXT = """\
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: prefix-cache-scorer
  parameters:
    scoreMode: tokens
    coldSpread: 1.0
- type: token-load-scorer
  parameters:
    queueThresholdTokens: 32768
- type: lora-affinity-scorer
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: prefix-cache-scorer
    weight: 3
  - pluginRef: token-load-scorer
    weight: 2
  - pluginRef: lora-affinity-scorer
    weight: 1
"""


@dataclass(frozen=True, slots=True)
class Pick:
    endpoint: Endpoint
    result: SchedulingResult | None = None  # a scheduler policy's decision (for its PreRequest hooks)


class Policy(Protocol):
    @property
    def name(self) -> str: ...

    def pick(self, req: InferenceRequest, candidates: Sequence[Endpoint]) -> Pick:
        """Choose the destination; may raise ``errors.PickerError`` (the request fails with its status)."""
        ...

    def routed(self, req: InferenceRequest, pick: Pick) -> None:
        """The router took its in-flight lease on ``pick.endpoint`` (the director's PreRequest point)."""
        ...

    def first_token(self, req: InferenceRequest, info: ResponseInfo) -> None:
        """A streamed response's first token arrived (the director's FirstToken point)."""
        ...

    def completed(self, req: InferenceRequest, info: ResponseInfo) -> None:
        """The response finished and its lease was released (the director's PostResponse point)."""
        ...

    def endpoints_changed(self, keys: frozenset[str]) -> None:
        """The pool is now ``keys`` (told once at the start, as the store's first snapshot is)."""
        ...


class _Baseline:
    """Shared plumbing of the baselines: the context, and no-op hooks."""

    name: ClassVar[str] = ""

    def __init__(self, ctx: PluginContext) -> None:
        self.ctx = ctx

    def inflight(self, endpoint: Endpoint) -> int:
        return self.ctx.inflight.requests(endpoint.key)

    def routed(self, req: InferenceRequest, pick: Pick) -> None:
        return None

    def first_token(self, req: InferenceRequest, info: ResponseInfo) -> None:
        return None

    def completed(self, req: InferenceRequest, info: ResponseInfo) -> None:
        return None

    def endpoints_changed(self, keys: frozenset[str]) -> None:
        return None


class RoundRobin(_Baseline):
    name = "rr"

    def __init__(self, ctx: PluginContext) -> None:
        super().__init__(ctx)
        self._next = itertools.count()

    def pick(self, req: InferenceRequest, candidates: Sequence[Endpoint]) -> Pick:
        ordered = sorted(candidates, key=lambda e: e.key)
        return Pick(ordered[next(self._next) % len(ordered)])


class LeastConnections(_Baseline):
    name = "lc"

    def pick(self, req: InferenceRequest, candidates: Sequence[Endpoint]) -> Pick:
        shuffled = list(candidates)
        self.ctx.rng.shuffle(shuffled)  # random tie-break, as the pickers do
        return Pick(min(shuffled, key=self.inflight))


class EnvoyLeastRequest(_Baseline):
    """Envoy's ``LEAST_REQUEST`` with equal host weights (see the module docstring)."""

    name = "envoy-least-request"

    def pick(self, req: InferenceRequest, candidates: Sequence[Endpoint]) -> Pick:
        first = candidates[self.ctx.rng.randrange(len(candidates))]
        second = candidates[self.ctx.rng.randrange(len(candidates))]
        return Pick(second if self.inflight(second) < self.inflight(first) else first)


class RandomPolicy(_Baseline):
    name = "random"

    def pick(self, req: InferenceRequest, candidates: Sequence[Endpoint]) -> Pick:
        return Pick(self.ctx.rng.choice(list(candidates)))


class PowerOfTwo(_Baseline):
    name = "p2c"

    def pick(self, req: InferenceRequest, candidates: Sequence[Endpoint]) -> Pick:
        if len(candidates) == 1:
            return Pick(candidates[0])
        a, b = self.ctx.rng.sample(list(candidates), 2)
        return Pick(b if self.inflight(b) < self.inflight(a) else a)


class PrefixSets:
    """What a router remembers sending where: per worker, an LRU set of chained hashes of character blocks.

    Hash i stands for the whole prefix up to block i (h_i = xxh3(block_i, seed=h_{i-1}), h_0 from the model),
    so "worker holds h_i" approximates "worker's radix tree holds the first i blocks of this text". The trailing
    partial block is hashed too, so a prompt sent before matches in full.
    """

    def __init__(self, block_chars: int = 64) -> None:
        self.block_chars = block_chars
        self._sets: dict[str, OrderedDict[int, None]] = {}

    def hashes(self, text: str, model: str) -> list[int]:
        data = text.encode()
        prev = xxhash.xxh3_64_intdigest(model.encode())
        out: list[int] = []
        for start in range(0, len(data), self.block_chars):
            prev = xxhash.xxh3_64_intdigest(data[start : start + self.block_chars], seed=prev)
            out.append(prev)
        return out

    def matched(self, key: str, hashes: Sequence[int]) -> int:
        """Leading blocks of ``hashes`` that worker ``key`` holds."""
        held = self._sets.get(key)
        if not held:
            return 0
        n = 0
        for h in hashes:
            if h not in held:
                break
            n += 1
        return n

    def insert(self, key: str, hashes: Sequence[int], capacity_blocks: int | None = None) -> None:
        held = self._sets.setdefault(key, OrderedDict())
        for h in reversed(hashes):  # the first blocks end most recently used: evicted after their extensions
            held[h] = None
            held.move_to_end(h)
        if capacity_blocks is not None:
            self._trim(held, capacity_blocks)

    def size(self, key: str) -> int:
        held = self._sets.get(key)
        return len(held) if held else 0

    def evict_to(self, capacity_blocks: int) -> None:
        for held in self._sets.values():
            self._trim(held, capacity_blocks)

    @staticmethod
    def _trim(held: OrderedDict[int, None], capacity_blocks: int) -> None:
        while len(held) > capacity_blocks:
            held.popitem(last=False)


def _match_share(matched_blocks: int, block_chars: int, text_chars: int) -> float:
    return min(1.0, matched_blocks * block_chars / text_chars) if text_chars else 0.0


class CacheAware(_Baseline):
    """SGLang / vllm-router ``cache_aware`` (see the module docstring)."""

    name = "cache-aware"

    def __init__(
        self,
        ctx: PluginContext,
        *,
        cache_threshold: float = 0.5,
        balance_abs: int = 32,
        balance_rel: float = 1.1,
        eviction_interval_s: float = 30.0,
        max_tree_chars: int = 10_000,
        block_chars: int = 64,
    ) -> None:
        super().__init__(ctx)
        self.cache_threshold = cache_threshold
        self.balance_abs = balance_abs
        self.balance_rel = balance_rel
        self.eviction_interval_s = eviction_interval_s
        self.max_tree_blocks = max(1, max_tree_chars // block_chars)
        self.trees = PrefixSets(block_chars)
        self._last_eviction_s: float | None = None

    def pick(self, req: InferenceRequest, candidates: Sequence[Endpoint]) -> Pick:
        self._maybe_evict()
        loads = [self.inflight(e) for e in candidates]
        hashes = self.trees.hashes(req.prompt_text, req.target_model)
        lo, hi = min(loads), max(loads)
        if hi - lo > self.balance_abs and hi > lo * self.balance_rel:
            chosen = candidates[loads.index(lo)]
        else:
            shares = [
                _match_share(self.trees.matched(e.key, hashes), self.trees.block_chars, len(req.prompt_text))
                for e in candidates
            ]
            best = max(range(len(candidates)), key=shares.__getitem__)
            if shares[best] > self.cache_threshold:
                chosen = candidates[best]
            else:
                chosen = min(candidates, key=lambda e: self.trees.size(e.key))
        self.trees.insert(chosen.key, hashes)
        return Pick(chosen)

    def _maybe_evict(self) -> None:
        now = self.ctx.clock()
        if self._last_eviction_s is None:
            self._last_eviction_s = now
        elif now - self._last_eviction_s >= self.eviction_interval_s:
            self.trees.evict_to(self.max_tree_blocks)
            self._last_eviction_s = now


class LMetric(_Baseline):
    """Uncached prompt tokens x (in-flight + 1), lowest wins (LMetric; SGLang ``lmetric``)."""

    name = "lmetric"

    def __init__(self, ctx: PluginContext, *, block_chars: int = 64) -> None:
        super().__init__(ctx)
        self.sets = PrefixSets(block_chars)

    def pick(self, req: InferenceRequest, candidates: Sequence[Endpoint]) -> Pick:
        hashes = self.sets.hashes(req.prompt_text, req.target_model)
        chars = len(req.prompt_text)
        tokens = max(1, req.prompt_tokens)
        shuffled = list(candidates)
        self.ctx.rng.shuffle(shuffled)

        def cost(e: Endpoint) -> float:
            share = _match_share(self.sets.matched(e.key, hashes), self.sets.block_chars, chars)
            # At least one token is always computed (the engine never serves the last prompt token from cache).
            uncached = max(1.0, tokens * (1.0 - share))
            return uncached * (self.inflight(e) + 1)

        chosen = min(shuffled, key=cost)
        m = chosen.metrics
        # Capacity in blocks of block_chars (~16 tokens at 4 characters per token), like picker's autoTune.
        capacity = m.num_gpu_blocks * (m.block_size or 16) * 4 // self.sets.block_chars if m.num_gpu_blocks else None
        self.sets.insert(chosen.key, hashes, capacity)
        return Pick(chosen)


class SchedulerPolicy:
    """picker's production scheduler under a configuration, with its PreRequest / PostResponse hooks."""

    def __init__(self, name: str, scheduler: Scheduler) -> None:
        self.name = name
        self.scheduler = scheduler

    def pick(self, req: InferenceRequest, candidates: Sequence[Endpoint]) -> Pick:
        result = self.scheduler.schedule(req, candidates)
        return Pick(result.targets[0], result)

    def routed(self, req: InferenceRequest, pick: Pick) -> None:
        if pick.result is not None:
            self.scheduler.pre_request(req, pick.result)

    def request_headers(self, req: InferenceRequest, pick: Pick) -> Mapping[str, str]:
        """Headers the decision sets on the upstream request (e.g. a P/D decision's ``x-prefiller-host-port``)."""
        return self.scheduler.request_headers(req, pick.result) if pick.result is not None else {}

    def first_token(self, req: InferenceRequest, info: ResponseInfo) -> None:
        self.scheduler.first_token(req, info)

    def completed(self, req: InferenceRequest, info: ResponseInfo) -> None:
        self.scheduler.post_response(req, info)

    def endpoints_changed(self, keys: frozenset[str]) -> None:
        self.scheduler.endpoints_changed(keys)


BASELINES: dict[str, Callable[[PluginContext], Policy]] = {
    "rr": RoundRobin,
    "lc": LeastConnections,
    "random": RandomPolicy,
    "p2c": PowerOfTwo,
    "envoy-least-request": EnvoyLeastRequest,
    "cache-aware": CacheAware,
    "lmetric": LMetric,
}
_ALIASES = {
    "round-robin": "rr",
    "least-connections": "lc",
    "least-request": "lc",
    "power-of-two": "p2c",
    "cache_aware": "cache-aware",
}
POLICY_NAMES = (*BASELINES, "reference", "picker", "picker-v1", "config:PATH")


def make_policy(spec: str, ctx: PluginContext) -> Policy:
    """A policy by name (``POLICY_NAMES``, aliases accepted) or ``config:PATH``. Raises ``ValueError`` for an
    unknown name and ``errors.ConfigError`` for a bad configuration."""
    spec = spec.strip()
    if spec.startswith("config:"):
        path = spec[len("config:") :]
        return SchedulerPolicy(spec, Scheduler(load_config_file(path, ctx), ctx))
    name = _ALIASES.get(spec, spec)
    if name == "reference":
        return SchedulerPolicy(name, Scheduler(load_config(REFERENCE_CONFIG_TEXT, ctx), ctx))
    if name == "picker":
        return SchedulerPolicy(name, Scheduler(load_config(None, ctx), ctx))
    if name == "picker-v1":
        return SchedulerPolicy(name, Scheduler(load_config(PREVIOUS_CONFIG_TEXT, ctx), ctx))
    factory = BASELINES.get(name)
    if factory is None:
        raise ValueError(f"unknown policy {spec!r}; choose from {', '.join(POLICY_NAMES)}")
    return factory(ctx)
