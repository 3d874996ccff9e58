"""What a scheduling cycle produced, and the optional hooks that see it.

``SchedulingResult`` is the decision: the targets, each profile's run (per-plugin scores, weights, totals, the
plugins whose contribution was dropped and why) and each plugin's duration. ``explain()`` renders it as JSON.
Plugins may implement the hooks ``pre_request`` (the destination is chosen), ``request_headers`` (headers to set
on the request sent upstream, e.g. llm-d's ``x-prefiller-host-port``), ``post_response`` (the response completed)
and ``endpoints_changed`` (the pool's membership changed).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol, runtime_checkable

from picker.endpoints.model import Endpoint
from picker.plugins.api import CycleState, ProfileResult
from picker.request.model import InferenceRequest

__all__ = [
    "EndpointsChanged",
    "FirstToken",
    "PluginTiming",
    "PostResponse",
    "PreRequest",
    "ProfileRun",
    "RequestHeaders",
    "ResponseHeaders",
    "ResponseInfo",
    "SchedulingResult",
]


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
    # plugin name -> why its contribution was dropped this cycle: "error", "budget", "invalid", "disabled"
    dropped: Mapping[str, str] = field(default_factory=dict)


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
        """A JSON-able explanation: each plugin's score per endpoint, per profile.

        A profile in which a plugin's contribution was dropped has ``"dropped": {name: reason}``.
        """
        profiles: list[dict[str, Any]] = []
        for r in self.runs:
            profile: dict[str, Any] = {
                "name": r.profile,
                "candidates": list(r.candidates),
                "weights": dict(r.weights),
                "scores": {s: dict(v) for s, v in r.scores.items()},
                "totals": dict(r.totals),
                "picked": [e.key for e in r.result.targets] if r.result else [],
            }
            if r.dropped:
                profile["dropped"] = dict(r.dropped)
            profiles.append(profile)
        return {"primary": self.primary_profile, "targets": [e.key for e in self.targets], "profiles": profiles}


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
class RequestHeaders(Protocol):
    """Optional hook: headers to set on the request picker routes upstream, once the destination is chosen (e.g.
    the disaggregation handler's ``x-prefiller-host-port`` for the decode pod's sidecar). picker sets them on the
    routing answer, overwriting any client-sent value; values must be strings."""

    def request_headers(self, req: InferenceRequest, result: SchedulingResult) -> Mapping[str, str]: ...


@runtime_checkable
class EndpointsChanged(Protocol):
    """Optional hook: the pool's membership changed; forget state of endpoints not in ``keys``."""

    def endpoints_changed(self, keys: frozenset[str]) -> None: ...


@runtime_checkable
class FirstToken(Protocol):
    """Optional hook: the first output token of a streamed response arrived (``info`` carries the endpoint and
    ``ttft_s``; usage is not known yet). Called once per request, before PostResponse; a response that is not
    streamed has no first token and goes to PostResponse only."""

    def first_token(self, req: InferenceRequest, info: ResponseInfo) -> None: ...


@runtime_checkable
class PostResponse(Protocol):
    """Optional hook: called when the response completes (or its in-flight lease times out)."""

    def post_response(self, req: InferenceRequest, info: ResponseInfo) -> None: ...


@runtime_checkable
class ResponseHeaders(Protocol):
    """Optional hook: headers to set on the response to the client, once ``endpoint`` is serving the request
    (e.g. session affinity's ``x-session-token``). Needs a gateway that sends response headers to picker."""

    def response_headers(self, endpoint: Endpoint) -> Mapping[str, str]: ...
