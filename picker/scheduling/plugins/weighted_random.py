"""weighted-random-picker: endpoints drawn at random in proportion to their scores (A-Res).

Type ``weighted-random-picker``. Each endpoint with score w > 0 gets the key U^(1/w), U uniform in (0, 1]; the
``maxNumOfEndpoints`` (default 1) largest keys win — a weighted sample without replacement (Efraimidis-Spirakis
A-Res). Endpoints scoring 0 come only after every positive one; all scores 0 ⇒ uniform. Keys are compared as
log(U)/w, which orders the same and does not underflow. Parameters: ``maxNumOfEndpoints`` ≥ 1.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import ClassVar

from picker.plugins import CycleState, Endpoint, PluginContext, ProfileResult
from picker.scheduling.framework import Picker
from picker.scheduling.pickers import CountingParams, CountingPicker
from picker.scheduling.spec import PluginSpec

__all__ = ["SPEC", "TYPE", "Params", "WeightedRandomPicker", "create"]

TYPE = "weighted-random-picker"


class Params(CountingParams):
    """``maxNumOfEndpoints`` (default 1): the primary plus fallbacks."""


class WeightedRandomPicker(CountingPicker):
    type: ClassVar[str] = TYPE
    __slots__ = ()

    def pick_ranked(self, endpoints: Sequence[Endpoint], totals: Sequence[float], cycle: CycleState) -> ProfileResult:
        if not endpoints:
            return ProfileResult(())
        rand = self._rng.random
        keys: list[tuple[float, float, int]] = []
        for i, w in enumerate(totals):
            u = 1.0 - rand()  # (0, 1]: log is finite
            keys.append((math.log(u) / w if w > 0.0 else -math.inf, rand(), i))
        keys.sort(reverse=True)
        return ProfileResult(tuple(endpoints[i] for _, _, i in keys[: self._count]))


def create(name: str, params: Params, ctx: PluginContext) -> Picker:
    return WeightedRandomPicker(name, params.max_num_of_endpoints, ctx.rng)


SPEC = PluginSpec(TYPE, Params, create)
