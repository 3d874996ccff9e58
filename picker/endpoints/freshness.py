"""FreshnessTracker: takes endpoints whose scrapes fail or go stale out of scheduling, with hysteresis.

The reference EPP keeps scheduling on an endpoint whose ``/metrics`` fails or stops answering, on its last
numbers (GIE #1497, #2328). Here an endpoint is **excluded** after ``fail_threshold`` consecutive failed polls,
(at the first one when the connection was refused: a killed or not yet started server), or when its last good
scrape is older than ``staleness_s`` (a poll that hangs never reports a failure, so the
age catches it); it is **readmitted** after ``recover_threshold`` consecutive good polls counted from the
exclusion. A new endpoint starts admitted and its age counts from when it was first tracked. Endpoints that are
never scraped (no metrics URL) are simply never tracked, so never excluded.

Pure state machine on an injected clock: the poller feeds it poll outcomes and applies the returned
``Transition``s (``store.set_excluded``, one log line each, metrics). Besides exclusion it reports the scrape
status changes (``FAILING`` on the first failure after success, ``OK`` on the first success after failures), so
the poller logs errors once per change instead of once per poll. ``EndpointSnapshot.candidates()`` still
falls back to every endpoint when all are excluded.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from picker.settings import ScrapeSettings

__all__ = ["REFUSED", "Change", "FreshnessTracker", "Transition"]

REFUSED = "refused"  # the poll's connection was refused: excluded at the first such failure


class Change(enum.Enum):
    FAILING = "failing"  # first failed poll after a good one (or the first poll ever failed)
    OK = "ok"  # first good poll after failures
    EXCLUDED = "excluded"
    READMITTED = "readmitted"


@dataclass(frozen=True, slots=True)
class Transition:
    key: str
    change: Change
    reason: str = ""  # EXCLUDED: "failing" | "stale"; FAILING: the error reason
    detail: str = ""  # human text for the log line


@dataclass(slots=True)
class _State:
    last_good: float  # clock time of the last good poll, or of first tracking
    failures: int = 0  # consecutive
    successes: int = 0  # consecutive, counted from the last failure or exclusion
    excluded: bool = False
    ever_good: bool = False


class FreshnessTracker:
    def __init__(
        self,
        *,
        fail_threshold: int,
        recover_threshold: int,
        staleness_s: float,
        clock: Callable[[], float],
    ) -> None:
        if fail_threshold < 1 or recover_threshold < 1:
            raise ValueError("fail_threshold and recover_threshold must be at least 1")
        if staleness_s <= 0:
            raise ValueError("staleness_s must be positive")
        self._fail_threshold = fail_threshold
        self._recover_threshold = recover_threshold
        self._staleness_s = staleness_s
        self._clock = clock
        self._states: dict[str, _State] = {}

    @classmethod
    def from_settings(cls, settings: ScrapeSettings, clock: Callable[[], float]) -> FreshnessTracker:
        return cls(
            fail_threshold=settings.fail_threshold,
            recover_threshold=settings.recover_threshold,
            staleness_s=settings.staleness_s,
            clock=clock,
        )

    def sync(self, keys: Iterable[str]) -> list[str]:
        """Track exactly ``keys``: new ones start admitted and fresh; returns the keys no longer tracked."""
        wanted = set(keys)
        removed = [k for k in self._states if k not in wanted]
        for key in removed:
            del self._states[key]
        now = self._clock()
        for key in wanted:
            if key not in self._states:
                self._states[key] = _State(last_good=now)
        return removed

    def forget(self, key: str) -> None:
        self._states.pop(key, None)

    def success(self, key: str) -> list[Transition]:
        """A good poll of ``key``."""
        st = self._states.get(key)
        if st is None:
            return []
        out: list[Transition] = []
        if st.failures:
            out.append(Transition(key, Change.OK, detail=f"after {st.failures} failed polls"))
        st.failures = 0
        st.successes += 1
        st.last_good = self._clock()
        st.ever_good = True
        if st.excluded and st.successes >= self._recover_threshold:
            st.excluded = False
            out.append(Transition(key, Change.READMITTED, detail=f"after {st.successes} good polls"))
        return out

    def failure(self, key: str, reason: str = "", detail: str = "") -> list[Transition]:
        """A failed poll of ``key`` (``reason``/``detail`` describe the error for the log)."""
        st = self._states.get(key)
        if st is None:
            return []
        out: list[Transition] = []
        if st.failures == 0:
            out.append(Transition(key, Change.FAILING, reason=reason, detail=detail))
        st.failures += 1
        st.successes = 0
        # A refused connection is no maybe: nothing listens there, and a request sent now fails the same way.
        decisive = reason == REFUSED
        if not st.excluded and (st.failures >= self._fail_threshold or decisive):
            out.append(self._exclude(key, st, "failing", f"{st.failures} consecutive failed polls ({detail})"))
        return out

    def check(self) -> list[Transition]:
        """Exclude the admitted endpoints whose last good poll is older than ``staleness_s``."""
        now = self._clock()
        out: list[Transition] = []
        for key, st in self._states.items():
            age_s = now - st.last_good
            if not st.excluded and age_s > self._staleness_s:
                since = "last good poll" if st.ever_good else "tracked, never scraped"
                out.append(self._exclude(key, st, "stale", f"{since} {age_s:.2f} s ago"))
        return out

    def is_excluded(self, key: str) -> bool:
        st = self._states.get(key)
        return st is not None and st.excluded

    def failures(self, key: str) -> int:
        st = self._states.get(key)
        return st.failures if st is not None else 0

    def age_s(self, key: str) -> float | None:
        """Seconds since the last good poll (or since tracking began); None when not tracked."""
        st = self._states.get(key)
        return None if st is None else self._clock() - st.last_good

    def keys(self) -> list[str]:
        return list(self._states)

    def _exclude(self, key: str, st: _State, reason: str, detail: str) -> Transition:
        st.excluded = True
        st.successes = 0  # readmission needs recover_threshold good polls from here
        return Transition(key, Change.EXCLUDED, reason=reason, detail=detail)
