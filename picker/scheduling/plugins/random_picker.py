"""random-picker: endpoints chosen uniformly at random, scores ignored.

Type ``random-picker``. Takes ``maxNumOfEndpoints`` (default 1) distinct endpoints uniformly at random.
Parameters: ``maxNumOfEndpoints`` ≥ 1.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from picker.plugins import CycleState, Endpoint, PluginContext, ProfileResult
from picker.scheduling.framework import Picker
from picker.scheduling.pickers import CountingParams, CountingPicker
from picker.scheduling.spec import PluginSpec

__all__ = ["SPEC", "TYPE", "Params", "RandomPicker", "create"]

TYPE = "random-picker"


class Params(CountingParams):
    """``maxNumOfEndpoints`` (default 1): the primary plus fallbacks."""


class RandomPicker(CountingPicker):
    type: ClassVar[str] = TYPE
    __slots__ = ()

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
