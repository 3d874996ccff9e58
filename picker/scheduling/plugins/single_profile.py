"""single-profile-handler: run the one scheduling profile, once; its targets are the destination.

Type ``single-profile-handler``. The configuration must have exactly one profile (the loader checks). No
parameters.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from picker.plugins import CycleState, InferenceRequest, PluginContext, PluginParams, ProfileResult
from picker.scheduling.framework import ProfileHandler
from picker.scheduling.spec import PluginSpec

__all__ = ["SPEC", "TYPE", "Params", "SingleProfileHandler", "create"]

TYPE = "single-profile-handler"


class Params(PluginParams):
    """No parameters."""


class SingleProfileHandler:
    type: ClassVar[str] = TYPE
    __slots__ = ("_only", "name")

    def __init__(self, name: str) -> None:
        self.name = name
        self._only: tuple[str, ...] = ()

    def pick_profiles(
        self,
        req: InferenceRequest,
        profiles: Mapping[str, Any],
        results: Mapping[str, ProfileResult | None],
        cycle: CycleState,
    ) -> Sequence[str]:
        if results:
            return ()
        if len(self._only) != 1 or self._only[0] not in profiles:
            self._only = tuple(profiles)[:1]  # remembered: the profile set is fixed after loading
        return self._only

    def primary(self, results: Mapping[str, ProfileResult | None]) -> str:
        return self._only[0] if self._only else next(iter(results), "")


def create(name: str, params: Params, ctx: PluginContext) -> ProfileHandler:
    return SingleProfileHandler(name)


SPEC = PluginSpec(TYPE, Params, create)
