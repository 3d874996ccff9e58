"""no-hit-lru-scorer (llm-d): spread cold requests (no prefix hit anywhere) over the least recently used endpoints.

Type ``no-hit-lru-scorer`` (Distribution). Input: the prefix match a prefix plugin left in the cycle
(``PrefixMatch``: the plugin named ``prefixPluginName``, else the last one that scored); it must come before this
scorer in the profile. No match state, or no candidate holding a block, makes the request *cold*.

* A request with a hit anywhere: every candidate scores 0.5 (neutral).
* A cold request: candidates never used for a cold request rank first (in candidate order), then the others from
  least to most recently used; rank r of N candidates scores 1 - r / (N - 1), floored at 0; one candidate ⇒ 1.0.

Learning (PreRequest): after a cold request, the primary target (and the ``prefill`` profile's target) becomes
the most recently used. The LRU holds at most ``lruSize`` endpoints; endpoints that leave the pool are dropped.
Cold requests build new KV-cache content, so spreading them spreads cache growth.

Parameters: ``lruSize`` 1024; ``prefixPluginName`` "" (picker: which prefix plugin's match to read);
``prefixPluginType``, ``prefixMatchInfoProducerName`` (accepted; deprecated or producer-specific in llm-d).
"""

from __future__ import annotations

from collections import OrderedDict
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
from picker.scheduling.plugins.prefix import MATCH_STATE, PrefixMatch, match_key
from picker.scheduling.scores import ScoreVector
from picker.scheduling.spec import PluginSpec

__all__ = ["SPEC", "TYPE", "NoHitLRUScorer", "Params", "create"]

TYPE = "no-hit-lru-scorer"
NEUTRAL = 0.5
PREFILL_PROFILE = "prefill"


class Params(PluginParams):
    lru_size: int = Field(default=1024, ge=1)
    prefix_plugin_name: str = ""
    prefix_plugin_type: str = ""
    prefix_match_info_producer_name: str = ""


class NoHitLRUScorer:
    type: ClassVar[str] = TYPE
    category: ClassVar[Category] = Category.DISTRIBUTION

    def __init__(self, name: str, *, lru_size: int = 1024, prefix_plugin_name: str = "") -> None:
        self.name = name
        self._size = lru_size
        self._match_key = match_key(prefix_plugin_name) if prefix_plugin_name else MATCH_STATE
        self._cold_key = f"{TYPE}/{name}/cold"
        self._lru: OrderedDict[str, None] = OrderedDict()  # endpoint key, least recently used first

    @property
    def lru(self) -> list[str]:
        """Endpoint keys, least recently used for a cold request first."""
        return list(self._lru)

    def score(self, req: InferenceRequest, endpoints: Sequence[Endpoint], cycle: CycleState) -> ScoreVector:
        match = cycle.get(self._match_key)
        cold = not isinstance(match, PrefixMatch) or match.cold
        cycle[self._cold_key] = cold
        if not cold:
            return ScoreVector.constant(endpoints, NEUTRAL)
        n = len(endpoints)
        if n <= 1:
            return ScoreVector.constant(endpoints, 1.0)
        position = {key: i for i, key in enumerate(self._lru)}
        never_used = [i for i, e in enumerate(endpoints) if e.key not in position]
        scores = [0.0] * n
        span = float(n - 1)
        for rank, i in enumerate(never_used):
            scores[i] = 1.0 - rank / span
        offset = len(never_used)
        for i, e in enumerate(endpoints):
            pos = position.get(e.key)
            if pos is not None:
                scores[i] = max(0.0, 1.0 - (offset + pos) / span)
        return ScoreVector(endpoints, scores)

    def pre_request(self, req: InferenceRequest, result: SchedulingResult) -> None:
        cycle = result.cycle
        if cycle is None or cycle.get(self._cold_key) is not True:
            return
        if result.targets:
            self._touch(result.targets[0].key)
        prefill = result.profile_results.get(PREFILL_PROFILE)
        if prefill is not None and prefill.targets and result.primary_profile != PREFILL_PROFILE:
            self._touch(prefill.targets[0].key)

    def endpoints_changed(self, keys: frozenset[str]) -> None:
        for key in [k for k in self._lru if k not in keys]:
            del self._lru[key]

    def _touch(self, key: str) -> None:
        lru = self._lru
        if key in lru:
            lru.move_to_end(key)
            return
        lru[key] = None
        while len(lru) > self._size:
            lru.popitem(last=False)


def create(name: str, params: Params, ctx: PluginContext) -> Scorer:
    return NoHitLRUScorer(name, lru_size=params.lru_size, prefix_plugin_name=params.prefix_plugin_name)


SPEC = PluginSpec(TYPE, Params, create)
