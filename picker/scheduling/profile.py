"""A scheduling profile: filters in order → weighted, clamped scorers → picker.

Every scorer's score is clamped to [0, 1] (NaN ⇒ 0; a missing endpoint ⇒ 0), multiplied by the profile's
weight for that scorer, and summed per endpoint. The run records each scorer's clamped score per endpoint
(the explanation) and each plugin's duration.

User plugins come wrapped by ``isolation``: the profile calls their guarded methods, and a dropped call is
recorded in the run's ``dropped`` (a scorer adds nothing, a filter filters nothing, a picker is replaced by
its fallback). Built-in plugins are called directly. After the filters, a ``Prefilter`` (the scheduler's, for
large pools) may cut the candidates to the least loaded and the prefix holders before any scorer runs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from time import perf_counter
from types import MappingProxyType
from typing import Protocol, runtime_checkable

from picker.endpoints.model import Endpoint
from picker.request.model import InferenceRequest
from picker.scheduling.framework import (
    CycleState,
    Filter,
    Picker,
    PluginTiming,
    ProfileResult,
    ProfileRun,
    ScoredEndpoint,
    Scorer,
    Scores,
)
from picker.scheduling.isolation import Dropped, GuardedFilter, GuardedPicker, GuardedScorer
from picker.scheduling.prefilter import Prefilter
from picker.scheduling.scores import KeyedScores, ScoreVector

__all__ = ["Profile", "ProfileOutcome", "RankedPicker", "WeightedScorer"]

FILTER, SCORER, PICKER = "Filter", "Scorer", "Picker"
PREFILTER = "prefilter"  # the explanation's "filtered" entry when the large-pool pre-filter cut the candidates


@runtime_checkable
class RankedPicker(Protocol):
    """A picker that also takes endpoints and totals as parallel sequences (the built-ins do): the profile then
    builds no ScoredEndpoint per endpoint per cycle."""

    def pick_ranked(
        self, endpoints: Sequence[Endpoint], totals: Sequence[float], cycle: CycleState
    ) -> ProfileResult: ...


@dataclass(frozen=True, slots=True)
class WeightedScorer:
    scorer: Scorer
    weight: float


@dataclass(frozen=True, slots=True)
class ProfileOutcome:
    run: ProfileRun
    failure: str | None  # why the profile has no result (None when it has one)


class Profile:
    """One named profile of a configuration. Immutable after loading."""

    __slots__ = ("_ranked", "_weights", "filters", "name", "picker", "scorers")

    def __init__(self, name: str, filters: Sequence[Filter], scorers: Sequence[WeightedScorer], picker: Picker) -> None:
        self.name = name
        self.filters = tuple(filters)
        self.scorers = tuple(scorers)
        self.picker = picker
        self._weights: Mapping[str, float] = MappingProxyType({w.scorer.name: w.weight for w in self.scorers})
        ranked = picker.pick_ranked if isinstance(picker, RankedPicker) else None
        self._ranked: Callable[[Sequence[Endpoint], Sequence[float], CycleState], ProfileResult] | None = ranked

    @property
    def weights(self) -> Mapping[str, float]:
        return self._weights

    def run(
        self,
        req: InferenceRequest,
        candidates: Sequence[Endpoint],
        cycle: CycleState,
        timings: list[PluginTiming],
        prefilter: Prefilter | None = None,
    ) -> ProfileOutcome:
        endpoints = candidates
        filtered: dict[str, tuple[str, ...]] = {}
        dropped: dict[str, str] = {}
        for f in self.filters:
            t0 = perf_counter()
            if type(f) is GuardedFilter:
                kept = f.guarded_filter(req, endpoints, cycle)
                timings.append(PluginTiming(FILTER, f.type, f.name, perf_counter() - t0))
                if isinstance(kept, Dropped):
                    dropped[f.name] = kept.reason  # no filtering this cycle
                    continue
                endpoints = kept
            else:
                endpoints = f.filter(req, endpoints, cycle)
                timings.append(PluginTiming(FILTER, f.type, f.name, perf_counter() - t0))
            filtered[f.name] = tuple(e.key for e in endpoints)
            if not endpoints:
                why = f"filter {f.name!r} ({f.type}) left no endpoints in profile {self.name!r}"
                return ProfileOutcome(self._run([e.key for e in candidates], {}, [], None, filtered, dropped), why)

        if prefilter is not None and len(endpoints) > prefilter.k:
            endpoints = prefilter.apply(req, endpoints, cycle)
            filtered[PREFILTER] = tuple(e.key for e in endpoints)
        keys = [e.key for e in endpoints]
        totals = [0.0] * len(endpoints)
        scores: dict[str, Mapping[str, float]] = {}
        for ws in self.scorers:
            scorer = ws.scorer
            t0 = perf_counter()
            if type(scorer) is GuardedScorer:
                guarded = scorer.guarded_score(req, endpoints, cycle)
                timings.append(PluginTiming(SCORER, scorer.type, scorer.name, perf_counter() - t0))
                if isinstance(guarded, Dropped):
                    dropped[scorer.name] = guarded.reason  # adds nothing to any endpoint this cycle
                    continue
                values: Sequence[float] = guarded
            else:
                raw = scorer.score(req, endpoints, cycle)
                timings.append(PluginTiming(SCORER, scorer.type, scorer.name, perf_counter() - t0))
                if type(raw) is ScoreVector and raw.endpoints is endpoints:
                    values = raw.scores  # positional: no endpoint hashing
                else:
                    values = _values(raw, endpoints)
            # Clamp into [0, 1]; NaN ⇒ 0 (``not v > 0``). Inline: this runs per endpoint per scorer.
            clamped = [(v if v <= 1.0 else 1.0) if v > 0.0 else 0.0 for v in values]
            weight = ws.weight
            totals = [t + weight * c for t, c in zip(totals, clamped, strict=True)]
            scores[scorer.name] = KeyedScores(keys, clamped)

        picker = self.picker
        t0 = perf_counter()
        result: ProfileResult | None
        if self._ranked is not None:
            result = self._ranked(endpoints, totals, cycle)
        else:
            scored = [ScoredEndpoint(e, t) for e, t in zip(endpoints, totals, strict=True)]
            if type(picker) is GuardedPicker:
                picked = picker.guarded_pick(scored, cycle)
                if isinstance(picked, Dropped):
                    dropped[picker.name] = picked.reason
                    picked = picker.fallback.pick(scored, cycle)
                result = picked
            else:
                result = picker.pick(scored, cycle)
        timings.append(PluginTiming(PICKER, picker.type, picker.name, perf_counter() - t0))
        failure: str | None = None
        if result is None or not result.targets:
            result = None
            failure = f"picker {picker.name!r} ({picker.type}) chose no endpoint in profile {self.name!r}"
        return ProfileOutcome(self._run(keys, scores, totals, result, filtered, dropped), failure)

    def _run(
        self,
        keys: list[str],
        scores: Mapping[str, Mapping[str, float]],
        totals: Sequence[float],
        result: ProfileResult | None,
        filtered: Mapping[str, tuple[str, ...]],
        dropped: Mapping[str, str],
    ) -> ProfileRun:
        return ProfileRun(
            profile=self.name,
            candidates=tuple(keys),
            scores=scores,
            weights=self._weights,
            totals=KeyedScores(keys, totals) if len(totals) == len(keys) else {},
            result=result,
            filtered=filtered,
            dropped=dropped,
        )


def _values(raw: Scores, endpoints: Sequence[Endpoint]) -> Sequence[float]:
    """A trusted scorer's result other than its own ScoreVector: a mapping (missing ⇒ 0) or aligned scores."""
    if isinstance(raw, Mapping):
        return [raw.get(e, 0.0) for e in endpoints]
    if len(raw) != len(endpoints):
        raise ValueError(f"{len(raw)} scores for {len(endpoints)} endpoints")
    return raw
