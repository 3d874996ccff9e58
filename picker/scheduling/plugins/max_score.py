"""max-score-picker: the endpoints with the highest weighted score.

Type ``max-score-picker``. Input: the profile's weighted totals. Takes the ``maxNumOfEndpoints`` (default 1)
best endpoints, highest first; ties are broken uniformly at random (the reference shuffles, then sorts stably —
the same distribution, drawn here without a shuffle). Endpoints after the first are fallbacks in the destination
list. Parameters: ``maxNumOfEndpoints`` ≥ 1.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from picker.plugins import CycleState, Endpoint, PluginContext, ProfileResult
from picker.scheduling.framework import Picker
from picker.scheduling.pickers import CountingParams, CountingPicker
from picker.scheduling.spec import PluginSpec

__all__ = ["SPEC", "TYPE", "MaxScorePicker", "Params", "create"]

TYPE = "max-score-picker"


class Params(CountingParams):
    """``maxNumOfEndpoints`` (default 1): the primary plus fallbacks."""


class MaxScorePicker(CountingPicker):
    type: ClassVar[str] = TYPE
    __slots__ = ()

    def pick_ranked(self, endpoints: Sequence[Endpoint], totals: Sequence[float], cycle: CycleState) -> ProfileResult:
        """``pick`` over parallel sequences (the profile's fast path: no ScoredEndpoint per endpoint)."""
        if not endpoints:
            return ProfileResult(())
        if self._count == 1:
            best = max(totals)
            ties = [i for i, t in enumerate(totals) if t == best]
            chosen = ties[0] if len(ties) == 1 else ties[self._rng.randrange(len(ties))]
            return ProfileResult((endpoints[chosen],))
        rand = self._rng.random
        ranked = sorted([(-t, rand(), i) for i, t in enumerate(totals)])
        return ProfileResult(tuple(endpoints[i] for _, _, i in ranked[: self._count]))


def create(name: str, params: Params, ctx: PluginContext) -> Picker:
    return MaxScorePicker(name, params.max_num_of_endpoints, ctx.rng)


SPEC = PluginSpec(TYPE, Params, create)
