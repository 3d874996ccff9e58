"""What the built-in pickers share: ``maxNumOfEndpoints``, a random source, and ``pick`` over ``pick_ranked``.

A picker subclasses ``CountingPicker`` and implements ``pick_ranked(endpoints, totals, cycle)``: the profile's
fast path over parallel sequences (no ``ScoredEndpoint`` per endpoint); ``pick`` adapts the protocol's form to it.
"""

from __future__ import annotations

import abc
import random
from collections.abc import Sequence

from pydantic import Field

from picker.plugins import CycleState, Endpoint, PluginParams, ProfileResult, ScoredEndpoint

__all__ = ["CountingParams", "CountingPicker"]


class CountingParams(PluginParams):
    max_num_of_endpoints: int = Field(default=1, ge=1)


class CountingPicker(abc.ABC):
    __slots__ = ("_count", "_rng", "name")

    def __init__(self, name: str, max_num_of_endpoints: int = 1, rng: random.Random | None = None) -> None:
        self.name = name
        self._count = max_num_of_endpoints
        self._rng = rng or random.Random()

    def pick(self, scored: Sequence[ScoredEndpoint], cycle: CycleState) -> ProfileResult:
        return self.pick_ranked([s.endpoint for s in scored], [s.score for s in scored], cycle)

    @abc.abstractmethod
    def pick_ranked(
        self, endpoints: Sequence[Endpoint], totals: Sequence[float], cycle: CycleState
    ) -> ProfileResult: ...
