"""The scheduling framework: plugin protocols and the values a scheduling cycle produces.

A cycle: the profile handler picks a profile; the profile runs its filters in order, then every scorer (each
score clamped to [0, 1] and multiplied by the profile's weight for that scorer, summed), then its picker. The
handler may run more profiles; it finally names the primary profile, whose targets become the destination list.

Plugins are synchronous and pure functions of their inputs plus their own state; they never do I/O.
"""

from __future__ import annotations

import enum
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, NamedTuple, Protocol, runtime_checkable

from picker.endpoints.inflight import InflightTracker
from picker.endpoints.model import Endpoint
from picker.request.model import InferenceRequest

__all__ = [
    "Category",
    "CycleState",
    "EndpointsChanged",
    "Filter",
    "Picker",
    "Plugin",
    "PluginContext",
    "PluginTiming",
    "PostResponse",
    "PreRequest",
    "ProfileHandler",
    "ProfileResult",
    "ProfileRun",
    "ResponseInfo",
    "SchedulingResult",
    "ScoredEndpoint",
    "Scorer",
]


class Category(enum.Enum):
    AFFINITY = "Affinity"
    DISTRIBUTION = "Distribution"
    BALANCE = "Balance"


@dataclass(frozen=True, slots=True)
class PluginContext:
    """What a plugin may use besides its inputs: a clock, picker's own in-flight counts, a random source."""

    clock: Callable[[], float]
    inflight: InflightTracker
    # The random source of pickers and tie-breaks; tests pass a seeded one.
    rng: random.Random = field(default_factory=random.Random)


class CycleState(dict[str, Any]):
    """Per-cycle scratch space shared by the plugins of one scheduling cycle (e.g. prefix match results)."""


@runtime_checkable
class Plugin(Protocol):
    type: ClassVar[str]
    name: str


@runtime_checkable
class Filter(Plugin, Protocol):
    def filter(
        self, req: InferenceRequest, endpoints: Sequence[Endpoint], cycle: CycleState
    ) -> Sequence[Endpoint]: ...


@runtime_checkable
class Scorer(Plugin, Protocol):
    category: ClassVar[Category]

    def score(
        self, req: InferenceRequest, endpoints: Sequence[Endpoint], cycle: CycleState
    ) -> Mapping[Endpoint, float]: ...


@dataclass(frozen=True, slots=True)
class ScoredEndpoint:
    endpoint: Endpoint
    score: float  # weighted sum over the profile's scorers


@dataclass(frozen=True, slots=True)
class ProfileResult:
    targets: tuple[Endpoint, ...]  # primary first, then fallbacks


@runtime_checkable
class Picker(Plugin, Protocol):
    def pick(self, scored: Sequence[ScoredEndpoint], cycle: CycleState) -> ProfileResult: ...


@dataclass(frozen=True, slots=True)
class ProfileRun:
    """What one profile did in a cycle: the explanation of its decision."""

    profile: str
    candidates: tuple[str, ...]  # endpoint keys after filtering
    # scorer name -> endpoint key -> clamped, unweighted score
    scores: Mapping[str, Mapping[str, float]]
    weights: Mapping[str, float]
    totals: Mapping[str, float]  # endpoint key -> weighted sum
    result: ProfileResult | None  # None: filtered to nothing
    filtered: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # filter name -> keys it kept


@runtime_checkable
class ProfileHandler(Plugin, Protocol):
    def pick_profiles(
        self,
        req: InferenceRequest,
        profiles: Mapping[str, Any],
        results: Mapping[str, ProfileResult | None],
        cycle: CycleState,
    ) -> Sequence[str]:
        """Names of the profiles to run next; empty when done."""
        ...

    def primary(self, results: Mapping[str, ProfileResult | None]) -> str:
        """The profile whose targets become the destination."""
        ...


class PluginTiming(NamedTuple):
    """How long one plugin took at one extension point (exported as inference_extension_plugin_duration_seconds).

    Extension points use the reference names: ProfilePicker, Filter, Scorer, Picker, ProcessProfilesResults,
    PreRequest, ResponseComplete. A NamedTuple: several are made per request.
    """

    extension_point: str
    plugin_type: str
    plugin_name: str
    seconds: float


@dataclass(frozen=True, slots=True)
class SchedulingResult:
    targets: tuple[Endpoint, ...]  # primary first
    primary_profile: str
    runs: tuple[ProfileRun, ...]
    profile_results: Mapping[str, ProfileResult | None]
    duration_s: float = 0.0
    plugin_timings: tuple[PluginTiming, ...] = ()
    # The cycle's scratch space, handed on so PreRequest hooks reuse what scorers computed (e.g. prefix hashes).
    cycle: CycleState | None = field(default=None, compare=False, repr=False)

    def explain(self) -> dict[str, Any]:
        """A JSON-able explanation: each plugin's score per endpoint, per profile."""
        return {
            "primary": self.primary_profile,
            "targets": [e.key for e in self.targets],
            "profiles": [
                {
                    "name": r.profile,
                    "candidates": list(r.candidates),
                    "weights": dict(r.weights),
                    "scores": {s: dict(v) for s, v in r.scores.items()},
                    "totals": dict(r.totals),
                    "picked": [e.key for e in r.result.targets] if r.result else [],
                }
                for r in self.runs
            ],
        }


@dataclass(frozen=True, slots=True)
class ResponseInfo:
    """What the response path learned, handed to PostResponse plugins when a response completes."""

    endpoint_key: str
    status: int | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None
    ttft_s: float | None = None
    duration_s: float | None = None


@runtime_checkable
class PreRequest(Protocol):
    """Optional hook: called once the destination is chosen (e.g. a prefix index learns the pick)."""

    def pre_request(self, req: InferenceRequest, result: SchedulingResult) -> None: ...


@runtime_checkable
class EndpointsChanged(Protocol):
    """Optional hook: the pool's membership changed; forget state of endpoints not in ``keys``."""

    def endpoints_changed(self, keys: frozenset[str]) -> None: ...


@runtime_checkable
class PostResponse(Protocol):
    """Optional hook: called when the response completes (or its in-flight lease times out)."""

    def post_response(self, req: InferenceRequest, info: ResponseInfo) -> None: ...
