"""Isolation of user plugins: a failing or slow plugin loses its say for a cycle, never fails the request.

Built-in plugins are trusted and called directly. A user plugin (``picker.scheduling.external``) is wrapped in
an adapter (``GuardedScorer`` / ``GuardedFilter`` / ``GuardedPicker``) that gives it its identity (the config's
type and name) and a ``Guard``. Each call:

* raises → dropped, reason ``error``;
* returns what the contract refuses (not numbers, wrong length, endpoints it was not given, no target) →
  dropped, reason ``invalid``;
* takes longer than its budget → dropped, reason ``budget``. A synchronous call can't be pre-empted: it is
  measured, and its result is discarded. After ``disable_after_overruns`` consecutive overruns the plugin is
  not called for ``cooldown_s`` (reason ``disabled``, gauge ``picker_plugin_disabled`` = 1); after the
  cool-down it is on probation: one more overrun disables it again, one call within budget clears it.

A dropped scorer adds nothing to any endpoint; a dropped filter filters nothing; a dropped picker is replaced
by ``max-score-picker`` for that cycle. Each drop counts in ``picker_plugin_errors_total{reason}``; the log
says when a plugin starts failing (with the traceback) and when it recovers, not on every call. The profile
records each drop in the cycle's explanation.

Time is read from the plugin context's clock, so the policy lab (virtual time) sees no overruns and stays
reproducible; in picker serve it is the monotonic clock.
"""

from __future__ import annotations

import logging
import math
import numbers
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final, TypeVar

from picker.endpoints.model import Endpoint
from picker.plugins import api
from picker.plugins.api import Category, CycleState, ProfileResult, ScoredEndpoint, Scores
from picker.request.model import InferenceRequest
from picker.scheduling.framework import Picker
from picker.scheduling.scores import ScoreVector
from picker.telemetry import plugins as metrics

__all__ = [
    "BUDGET",
    "DEFAULT_ISOLATION",
    "DISABLED",
    "ERROR",
    "INVALID",
    "Dropped",
    "Guard",
    "GuardedFilter",
    "GuardedPicker",
    "GuardedPlugin",
    "GuardedScorer",
    "Isolation",
    "filter_values",
    "pick_values",
    "score_values",
]

log = logging.getLogger(__name__)

ERROR, INVALID, BUDGET, DISABLED = "error", "invalid", "budget", "disabled"
_WHAT = {ERROR: "raised", INVALID: "returned an invalid result", BUDGET: "ran over its time budget"}

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Isolation:
    """How user plugins are held to account (config ``pluginIsolation``; ``budgetMs`` per plugin)."""

    budget_s: float = 0.005  # per call
    disable_after_overruns: int = 5  # consecutive; 0: never disable
    cooldown_s: float = 30.0


DEFAULT_ISOLATION: Final = Isolation()


class Dropped:
    """A guarded call's result was dropped; ``reason`` says why. One instance per reason."""

    __slots__ = ("reason",)

    def __init__(self, reason: str) -> None:
        self.reason = reason

    def __repr__(self) -> str:
        return f"Dropped({self.reason!r})"


_DROPPED: Final = {r: Dropped(r) for r in (ERROR, INVALID, BUDGET, DISABLED)}


class Guard:
    """One user plugin's accounting at one extension point: budget, consecutive overruns, failing state."""

    __slots__ = (
        "_budget_s",
        "_clock",
        "_counters",
        "_disabled",
        "_disabled_until",
        "_drops",
        "_failing",
        "_isolation",
        "_overruns",
        "label",
        "plugin_name",
        "plugin_type",
    )

    def __init__(
        self,
        plugin_type: str,
        plugin_name: str,
        point: str,
        isolation: Isolation,
        clock: Callable[[], float],
        *,
        budget_s: float | None = None,
        timed: bool = True,
    ) -> None:
        self.plugin_type = plugin_type
        self.plugin_name = plugin_name
        self.label = f"{point} plugin {plugin_name!r} ({plugin_type})"
        self._isolation = isolation
        self._clock = clock
        # Hooks (timed=False) run after the decision: nothing to drop for time, so no budget and no cool-down.
        self._budget_s = (budget_s if budget_s is not None else isolation.budget_s) if timed else math.inf
        self._overruns = 0
        self._disabled_until: float | None = None
        self._failing: str | None = None
        self._drops = 0
        # Created up front so every reason is exported (at 0) from the start: rate() needs the series.
        self._counters = {r: metrics.PLUGIN_ERRORS.labels(plugin_type, plugin_name, r) for r in metrics.REASONS}
        self._disabled = metrics.PLUGIN_DISABLED.labels(plugin_type, plugin_name) if timed else None
        if self._disabled is not None:
            self._disabled.set(0)

    @property
    def budget_s(self) -> float:
        return self._budget_s

    @property
    def disabled(self) -> bool:
        return self._disabled_until is not None

    def hook_guard(self, point: str) -> Guard:
        """A guard for one of the plugin's hooks: same labels, errors counted, no budget."""
        return Guard(self.plugin_type, self.plugin_name, point, self._isolation, self._clock, timed=False)

    def call(self, fn: Callable[..., T], *args: object) -> T | Dropped:
        """``fn(*args)``, or ``Dropped`` if it is cooling down, raised or ran over budget."""
        if self._disabled_until is not None and not self._cooled_down():
            return _DROPPED[DISABLED]
        clock = self._clock
        started = clock()
        try:
            out = fn(*args)
        except Exception as exc:  # a user plugin's bug must not fail the request
            return self._drop(ERROR, f"{type(exc).__name__}: {exc}", exc)
        elapsed_s = clock() - started
        if elapsed_s > self._budget_s:
            return self._overrun(elapsed_s)
        self._overruns = 0
        return out

    def invalid(self, why: str) -> Dropped:
        """The call returned, but its result breaks the contract."""
        return self._drop(INVALID, why)

    def ok(self) -> None:
        """The call's result is used."""
        if self._failing is not None:
            log.info("%s recovered after %d dropped calls", self.label, self._drops)
            self._failing = None
            self._drops = 0

    def _drop(self, reason: str, detail: str, exc: BaseException | None = None) -> Dropped:
        self._counters[reason].inc()
        self._drops += 1
        if self._failing != reason:
            self._failing = reason
            log.warning(
                "%s %s (%s); its result is dropped until it recovers", self.label, _WHAT[reason], detail, exc_info=exc
            )
        return _DROPPED[reason]

    def _overrun(self, elapsed_s: float) -> Dropped:
        self._overruns += 1
        dropped = self._drop(BUDGET, f"{elapsed_s * 1e3:.2f} ms, budget {self._budget_s * 1e3:g} ms")
        limit = self._isolation.disable_after_overruns
        if limit and self._overruns >= limit:
            self._disabled_until = self._clock() + self._isolation.cooldown_s
            if self._disabled is not None:
                self._disabled.set(1)
            log.warning(
                "%s disabled for %g s after %d consecutive budget overruns",
                self.label,
                self._isolation.cooldown_s,
                self._overruns,
            )
        return dropped

    def _cooled_down(self) -> bool:
        until = self._disabled_until
        if until is not None and self._clock() >= until:
            self._disabled_until = None
            if self._disabled is not None:
                self._disabled.set(0)
            # Probation: the next overrun alone disables it again.
            self._overruns = max(0, self._isolation.disable_after_overruns - 1)
            log.info("%s re-enabled after its cool-down", self.label)
            return True
        return False


class GuardedPlugin:
    """A user plugin with its identity and its guard. ``plugin`` is the user's instance."""

    __slots__ = ("guard", "name", "plugin", "type")

    def __init__(self, plugin: object, plugin_type: str, name: str, guard: Guard) -> None:
        self.plugin = plugin
        self.type = plugin_type
        self.name = name
        self.guard = guard

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r}, {self.type!r})"


class GuardedScorer(GuardedPlugin):
    __slots__ = ("category", "scorer")

    def __init__(self, plugin: api.Scorer, plugin_type: str, name: str, guard: Guard, category: Category) -> None:
        super().__init__(plugin, plugin_type, name, guard)
        self.scorer = plugin
        self.category = category

    def score(self, req: InferenceRequest, endpoints: Sequence[Endpoint], cycle: CycleState) -> Scores:
        out = self.guarded_score(req, endpoints, cycle)
        return ScoreVector.constant(endpoints, 0.0) if isinstance(out, Dropped) else ScoreVector(endpoints, out)

    def guarded_score(
        self, req: InferenceRequest, endpoints: Sequence[Endpoint], cycle: CycleState
    ) -> list[float] | Dropped:
        out = self.guard.call(self.scorer.score, req, endpoints, cycle)
        if isinstance(out, Dropped):
            return out
        values = score_values(out, endpoints)
        if isinstance(values, str):
            return self.guard.invalid(values)
        self.guard.ok()
        return values


class GuardedFilter(GuardedPlugin):
    __slots__ = ("filterer",)

    def __init__(self, plugin: api.Filter, plugin_type: str, name: str, guard: Guard) -> None:
        super().__init__(plugin, plugin_type, name, guard)
        self.filterer = plugin

    def filter(self, req: InferenceRequest, endpoints: Sequence[Endpoint], cycle: CycleState) -> Sequence[Endpoint]:
        out = self.guarded_filter(req, endpoints, cycle)
        return endpoints if isinstance(out, Dropped) else out

    def guarded_filter(
        self, req: InferenceRequest, endpoints: Sequence[Endpoint], cycle: CycleState
    ) -> tuple[Endpoint, ...] | Dropped:
        out = self.guard.call(self.filterer.filter, req, endpoints, cycle)
        if isinstance(out, Dropped):
            return out
        kept = filter_values(out, endpoints)
        if isinstance(kept, str):
            return self.guard.invalid(kept)
        self.guard.ok()
        return kept


class GuardedPicker(GuardedPlugin):
    __slots__ = ("fallback", "picker")

    def __init__(self, plugin: api.Picker, plugin_type: str, name: str, guard: Guard, fallback: Picker) -> None:
        super().__init__(plugin, plugin_type, name, guard)
        self.picker = plugin
        self.fallback = fallback  # used in a cycle where the plugin's pick is dropped

    def pick(self, scored: Sequence[ScoredEndpoint], cycle: CycleState) -> ProfileResult:
        out = self.guarded_pick(scored, cycle)
        return self.fallback.pick(scored, cycle) if isinstance(out, Dropped) else out

    def guarded_pick(self, scored: Sequence[ScoredEndpoint], cycle: CycleState) -> ProfileResult | Dropped:
        out = self.guard.call(self.picker.pick, scored, cycle)
        if isinstance(out, Dropped):
            return out
        result = pick_values(out, scored)
        if isinstance(result, str):
            return self.guard.invalid(result)
        self.guard.ok()
        return result


# -- the contract, checked on what a user plugin returns -------------------------------------------------


def score_values(raw: object, endpoints: Sequence[Endpoint]) -> list[float] | str:
    """A scorer's result as floats aligned with ``endpoints``, or why it is invalid."""
    try:
        if isinstance(raw, Mapping):
            values = [raw.get(e, 0.0) for e in endpoints]
        elif isinstance(raw, str | bytes) or not isinstance(raw, Iterable):
            return f"score() returned {type(raw).__name__}, not a mapping of endpoints or a sequence of scores"
        else:
            values = list(raw)
            if len(values) != len(endpoints):
                return f"score() returned {len(values)} scores for {len(endpoints)} endpoints"
    except Exception as exc:  # a user mapping or iterator that fails while read
        return f"reading score()'s result raised {type(exc).__name__}: {exc}"
    for v in values:
        if type(v) is not float and not isinstance(v, numbers.Real):
            return f"score() returned {v!r} ({type(v).__name__}), not a number"
    return [float(v) for v in values]


def filter_values(raw: object, endpoints: Sequence[Endpoint]) -> tuple[Endpoint, ...] | str:
    """A filter's result as the caller's own endpoints, in the filter's order, or why it is invalid."""
    if isinstance(raw, str | bytes) or not isinstance(raw, Iterable):
        return f"filter() returned {type(raw).__name__}, not a sequence of endpoints"
    given = {e.key: e for e in endpoints}
    kept: dict[str, Endpoint] = {}
    try:
        for e in raw:
            key = e.key if isinstance(e, Endpoint) else None
            if key is None or key not in given:
                return f"filter() returned {e!r}, which is not one of the endpoints it was given"
            if key in kept:
                return f"filter() returned {key} twice"
            kept[key] = given[key]  # the caller's object: a filter can't alter what later plugins read
    except Exception as exc:
        return f"reading filter()'s result raised {type(exc).__name__}: {exc}"
    return tuple(kept.values())


def pick_values(raw: object, scored: Sequence[ScoredEndpoint]) -> ProfileResult | str:
    """A picker's result with the caller's own endpoints, or why it is invalid."""
    if not isinstance(raw, ProfileResult):
        return f"pick() returned {type(raw).__name__}, not a ProfileResult"
    if not raw.targets:
        return "pick() chose no endpoint"
    kept = filter_values(raw.targets, [s.endpoint for s in scored])
    if isinstance(kept, str):
        return kept.replace("filter()", "pick()")
    return ProfileResult(kept)
