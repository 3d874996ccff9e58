"""The scheduling framework: the engine's view of a plugin, and the values a scheduling cycle produces.

A cycle: the profile handler picks a profile; the profile runs its filters in order, then every scorer (each
score clamped to [0, 1] and multiplied by the profile's weight for that scorer, summed), then its picker. The
handler may run more profiles; it finally names the primary profile, whose targets become the destination list.

The public plugin API (``picker.plugins``) defines the role protocols, the context and the result values; this
module re-exports them and adds what the engine needs besides: every configured plugin has an identity
(``type``, ``name``) and scorers a ``Category``. Built-in plugins carry these themselves; a user plugin gets
them from the loader's isolating adapter (``picker.scheduling.isolation``).

Plugins are synchronous and pure functions of their inputs plus their own state; they never do I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from picker.plugins import api
from picker.plugins.api import (
    ROTATE_TIES,
    UNCACHED_TOKENS,
    Category,
    CycleState,
    PluginContext,
    ProfileResult,
    ScoredEndpoint,
    Scores,
)
from picker.plugins.results import (
    EndpointsChanged,
    FirstToken,
    PluginTiming,
    PostResponse,
    PreRequest,
    ProfileRun,
    RequestHeaders,
    ResponseHeaders,
    ResponseInfo,
    SchedulingResult,
)
from picker.request.model import InferenceRequest

__all__ = [
    "ROTATE_TIES",
    "UNCACHED_TOKENS",
    "Category",
    "CycleState",
    "EndpointsChanged",
    "Filter",
    "FirstToken",
    "Picker",
    "Plugin",
    "PluginContext",
    "PluginTiming",
    "PostResponse",
    "PreRequest",
    "ProfileHandler",
    "ProfileResult",
    "ProfileRun",
    "RequestHeaders",
    "ResponseHeaders",
    "ResponseInfo",
    "SchedulingResult",
    "ScoredEndpoint",
    "Scorer",
    "Scores",
]


@runtime_checkable
class Plugin(Protocol):
    """A configured plugin's identity: its type (the config's ``type``) and its name (unique in a config)."""

    @property
    def type(self) -> str: ...

    name: str


@runtime_checkable
class Filter(Plugin, api.Filter, Protocol):
    pass


@runtime_checkable
class Scorer(Plugin, api.Scorer, Protocol):
    @property
    def category(self) -> Category: ...


@runtime_checkable
class Picker(Plugin, api.Picker, Protocol):
    pass


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
