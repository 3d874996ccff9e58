"""random-picker: endpoints chosen uniformly at random, scores ignored.

Type ``random-picker``. Takes ``maxNumOfEndpoints`` (default 1) distinct endpoints uniformly at random.
Parameters: ``maxNumOfEndpoints`` ≥ 1.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import ClassVar

from pydantic import Field

from picker.plugins import CycleState, Endpoint, PluginContext, PluginParams, ProfileResult, ScoredEndpoint
from picker.scheduling.framework import Picker
from picker.scheduling.spec import PluginSpec

__all__ = ["SPEC", "TYPE", "Params", "RandomPicker", "create"]

TYPE = "random-picker"


class Params(PluginParams):
    max_num_of_endpoints: int = Field(default=1, ge=1)


class RandomPicker:
    type: ClassVar[str] = TYPE
    __slots__ = ("_count", "_rng", "name")

    def __init__(self, name: str, max_num_of_endpoints: int = 1, rng: random.Random | None = None) -> None:
        self.name = name
        self._count = max_num_of_endpoints
        self._rng = rng or random.Random()

    def pick(self, scored: Sequence[ScoredEndpoint], cycle: CycleState) -> ProfileResult:
        return self.pick_ranked([s.endpoint for s in scored], [s.score for s in scored], cycle)

    def pick_ranked(self, endpoints: Sequence[Endpoint], totals: Sequence[float], cycle: CycleState) -> ProfileResult:
        if not endpoints:
            return ProfileResult(())
        if self._count == 1:
            return ProfileResult((endpoints[self._rng.randrange(len(endpoints))],))
        chosen = self._rng.sample(range(len(endpoints)), min(self._count, len(endpoints)))
        return ProfileResult(tuple(endpoints[i] for i in chosen))


def create(name: str, params: Params, ctx: PluginContext) -> Picker:
    return RandomPicker(name, params.max_num_of_endpoints, ctx.rng)


SPEC = PluginSpec(TYPE, Params, create)
