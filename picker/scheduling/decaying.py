"""Per-key counts that fade: each unit added loses half its weight every ``half_life_s``; and the share of recent
events that were a "yes", fading by event.

What a scorer uses to remember "how much was sent where lately" without a window of events: one float and one
timestamp per key, brought up to date when read or added to.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

__all__ = ["DecayingCounts", "RecentShare"]


class DecayingCounts:
    __slots__ = ("_clock", "_counts", "_rate")

    def __init__(self, half_life_s: float, clock: Callable[[], float]) -> None:
        if not half_life_s > 0.0:
            raise ValueError("half_life_s must be > 0")
        self._rate = math.log(2.0) / half_life_s  # per second; inf half-life ⇒ 0: counts never fade
        self._clock = clock
        self._counts: dict[str, tuple[float, float]] = {}  # key -> (count, when it was last brought up to date)

    def add(self, key: str, amount: float) -> None:
        now = self._clock()
        self._counts[key] = (self._at(key, now) + amount, now)

    def get(self, key: str) -> float:
        return self._at(key, self._clock())

    def retain(self, keys: Iterable[str]) -> None:
        """Forget every key not in ``keys``."""
        keep = set(keys)
        self._counts = {k: v for k, v in self._counts.items() if k in keep}

    def _at(self, key: str, now: float) -> float:
        found = self._counts.get(key)
        if found is None:
            return 0.0
        count, then = found
        return count * math.exp(-self._rate * (now - then)) if now > then else count


class RecentShare:
    """The share of recent events that were a "yes": a moving average over about ``1 / weight`` events (0.02:
    the last 50), starting at ``start`` (0). A scorer's test of what most recent requests are (prompts that hit,
    short ones)."""

    __slots__ = ("_weight", "value")

    def __init__(self, weight: float = 0.02, start: float = 0.0) -> None:
        if not 0.0 < weight <= 1.0:
            raise ValueError("weight must be in (0, 1]")
        if not 0.0 <= start <= 1.0:
            raise ValueError("start must be in [0, 1]")
        self._weight = weight
        self.value = start

    def add(self, yes: bool | float) -> float:
        """Count one event, a yes (True, 1.0), a no, or a part of a yes (a share in [0, 1] of one event's
        requests); returns the share after it."""
        self.value += self._weight * (float(yes) - self.value)
        return self.value
