"""max-score-picker: the endpoints with the highest weighted score.

Type ``max-score-picker``. Input: the profile's weighted totals. Takes the ``maxNumOfEndpoints`` (default 1)
best endpoints, highest first. Endpoints after the first are fallbacks in the destination list.

Parameters: ``maxNumOfEndpoints`` ≥ 1 (reference); picker's ``tieBreak`` and ``tieTolerance``:

* ``tieBreak`` ``random`` (reference): ties are broken uniformly at random (the reference shuffles, then sorts
  stably — the same distribution, drawn here without a shuffle). ``roundRobin``: the tied endpoint this picker
  chose least recently wins (never chosen: in an order drawn at random once per endpoint, so that picker
  replicas, each with its own rotation, do not all start on the same endpoint). When every endpoint ties on
  every cycle that is exactly round robin; when the tied set changes it still spreads evenly, because an
  endpoint just chosen for any reason (a cache hit included) waits behind every other tied one. Random choice
  leaves runs of two or three picks on one endpoint; when the requests are short, each lands in the prefill step
  of the one before it and waits for it.
* ``tieTolerance`` 0 (exact ties only; ≥ 0, in score units of the weighted total): endpoints whose total is within
  this of the best count as tied, so a difference smaller than what the scorers can tell apart (a few tokens of
  load, one more block placed) does not decide alone.

A scorer may ask for the rotation for one request (the cycle-state flag ``framework.ROTATE_TIES``, for a request
its scores leave tied by design): with ``tieBreak: random`` that request's ties are then broken by a rotation of
its own, kept over the flagged requests only, so they are spread evenly among themselves whatever the other
requests' picks were.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import ClassVar, Literal

from pydantic import Field

from picker.plugins import CycleState, Endpoint, PluginContext, ProfileResult
from picker.scheduling.framework import ROTATE_TIES, Picker
from picker.scheduling.pickers import CountingParams, CountingPicker
from picker.scheduling.spec import PluginSpec

__all__ = ["SPEC", "TYPE", "MaxScorePicker", "Params", "TieBreak", "create"]

TYPE = "max-score-picker"

TieBreak = Literal["random", "roundRobin"]


class Params(CountingParams):
    """``maxNumOfEndpoints`` (default 1): the primary plus fallbacks; ``tieBreak``, ``tieTolerance``: ties."""

    tie_break: TieBreak = "random"
    tie_tolerance: float = Field(default=0.0, ge=0.0)


class MaxScorePicker(CountingPicker):
    type: ClassVar[str] = TYPE
    __slots__ = ("_first_order", "_flagged", "_last_chosen", "_picks", "_round_robin", "_tolerance")

    def __init__(
        self,
        name: str,
        max_num_of_endpoints: int = 1,
        rng: random.Random | None = None,
        *,
        tie_break: TieBreak = "random",
        tie_tolerance: float = 0.0,
    ) -> None:
        super().__init__(name, max_num_of_endpoints, rng)
        self._round_robin = tie_break == "roundRobin"
        self._tolerance = tie_tolerance
        self._picks = 0  # primaries chosen by the rotation so far: the clock of ``_last_chosen``
        self._last_chosen: dict[str, int] = {}  # endpoint key -> the pick number when it was last the primary
        self._first_order: dict[str, float] = {}  # endpoint key -> its random place among the never chosen
        # The rotation of the requests a scorer flagged (``ROTATE_TIES``) when ``tieBreak`` is random.
        self._flagged: MaxScorePicker | None = None

    def pick_ranked(self, endpoints: Sequence[Endpoint], totals: Sequence[float], cycle: CycleState) -> ProfileResult:
        """``pick`` over parallel sequences (the profile's fast path: no ScoredEndpoint per endpoint)."""
        if not endpoints:
            return ProfileResult(())
        if not self._round_robin and cycle.get(ROTATE_TIES):
            flagged = self._flagged
            if flagged is None:
                flagged = self._flagged = MaxScorePicker(
                    self.name, self._count, self._rng, tie_break="roundRobin", tie_tolerance=self._tolerance
                )
            return flagged.pick_ranked(endpoints, totals, cycle)
        best = max(totals)
        floor = best - self._tolerance
        if self._count == 1:
            ties = [i for i, t in enumerate(totals) if t >= floor]
            if len(ties) == 1:
                chosen = ties[0]
            elif self._round_robin:
                chosen = min(ties, key=lambda i: self._recency(endpoints[i]))
            else:
                chosen = ties[self._rng.randrange(len(ties))]
            self._chose(endpoints, chosen)
            return ProfileResult((endpoints[chosen],))
        # Every endpoint in the tie band ranks as the best; within a score, the tie-break orders.
        if self._round_robin:
            order = sorted(
                range(len(endpoints)),
                key=lambda i: (-(best if totals[i] >= floor else totals[i]), self._recency(endpoints[i])),
            )
        else:
            rand = self._rng.random
            order = [i for *_, i in sorted([(-(best if t >= floor else t), rand(), i) for i, t in enumerate(totals)])]
        self._chose(endpoints, order[0])
        return ProfileResult(tuple(endpoints[i] for i in order[: self._count]))

    def _recency(self, endpoint: Endpoint) -> tuple[int, float]:
        """Sort key of the round-robin tie-break: least recently chosen first; never chosen in a random order."""
        key = endpoint.key
        last = self._last_chosen.get(key)
        if last is not None:
            return last, 0.0
        place = self._first_order.get(key)
        if place is None:
            place = self._first_order[key] = self._rng.random()
        return -1, place

    def _chose(self, endpoints: Sequence[Endpoint], chosen: int) -> None:
        if not self._round_robin:
            return
        last = self._last_chosen
        last[endpoints[chosen].key] = self._picks
        self._picks += 1
        if len(last) > 2 * len(endpoints) + 64:  # endpoints came and went: forget the ones not offered now
            keys = {e.key for e in endpoints}
            self._last_chosen = {k: n for k, n in last.items() if k in keys}
            self._first_order = {k: p for k, p in self._first_order.items() if k in keys}


def create(name: str, params: Params, ctx: PluginContext) -> Picker:
    return MaxScorePicker(
        name, params.max_num_of_endpoints, ctx.rng, tie_break=params.tie_break, tie_tolerance=params.tie_tolerance
    )


SPEC = PluginSpec(TYPE, Params, create)
