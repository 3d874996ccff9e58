"""Passive outlier detection: an endpoint that answers only 5xx is ejected from scheduling for a while.

A server can fail every request while its ``/metrics`` still answers (an engine error loop, a broken adapter, a
bad GPU), so scrape freshness never sees it; picker does, in the responses it relays. As Envoy's outlier detection
(``consecutive_5xx``, default 5; ``base_ejection_time``; ``max_ejection_percent``): after ``consecutive_5xx``
responses in a row with a 5xx status, the endpoint is ejected for ``base_ejection_s`` times the number of times it was
ejected before (capped at ``max_ejection_s``), then readmitted; a success resets its count. At most
``max_ejected_fraction`` of the endpoints are ejected at once (at least one), and ``EndpointSnapshot.candidates``
still falls back to every endpoint when nothing else is left. A pure state machine on an injected clock: the
director feeds it response statuses and applies the keys it returns (``EndpointStore.set_ejected``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["OutlierDetector", "OutlierSettings"]


@dataclass(frozen=True, slots=True)
class OutlierSettings:
    consecutive_5xx: int = 5
    base_ejection_s: float = 10.0
    max_ejection_s: float = 300.0
    max_ejected_fraction: float = 0.5


@dataclass(slots=True)
class _State:
    failures: int = 0
    ejections: int = 0
    ejected_until: float | None = None


class OutlierDetector:
    def __init__(self, settings: OutlierSettings | None = None) -> None:
        self.settings = settings or OutlierSettings()
        self._states: dict[str, _State] = {}

    def ejected(self) -> frozenset[str]:
        return frozenset(k for k, s in self._states.items() if s.ejected_until is not None)

    def record(self, key: str, status: int | None, now: float, pool_size: int) -> bool:
        """One response of ``key``. True if it was ejected by it."""
        if status is None:
            return False
        state = self._states.setdefault(key, _State())
        if status < 500:
            state.failures = 0
            return False
        state.failures += 1
        if state.ejected_until is not None or state.failures < self.settings.consecutive_5xx:
            return False
        allowed = max(1, int(pool_size * self.settings.max_ejected_fraction))
        if len(self.ejected()) >= allowed:
            return False
        state.ejections += 1
        hold_s = min(self.settings.base_ejection_s * state.ejections, self.settings.max_ejection_s)
        state.ejected_until = now + hold_s
        state.failures = 0
        return True

    def readmit_due(self, now: float) -> list[str]:
        """Keys whose ejection ended by ``now``; they are readmitted (their ejection count stays)."""
        due = [k for k, s in self._states.items() if s.ejected_until is not None and s.ejected_until <= now]
        for key in due:
            self._states[key].ejected_until = None
        return due

    def forget_except(self, keys: Iterable[str]) -> None:
        keep = set(keys)
        for key in [k for k in self._states if k not in keep]:
            del self._states[key]
