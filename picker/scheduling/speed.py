"""What a plugin that rates the servers' speed offers the others: ``SpeedSource``, and the lookup of the plugin a
``...SpeedFrom`` parameter names (``prefix-cache-scorer``'s ``coldSpreadSpeedFrom``, ``token-load-scorer``'s
``prefillPendingSpeedFrom``; the ``relative-ttft-scorer`` is the one that rates it)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol, runtime_checkable

from picker.plugins import Endpoint

__all__ = ["SpeedSource", "resolve_speed_source"]


@runtime_checkable
class SpeedSource(Protocol):
    """A plugin that knows how much slower than the pool each endpoint answers (``relative-ttft-scorer``)."""

    def slowness_factors(self, endpoints: Sequence[Endpoint]) -> list[float]:
        """For each endpoint, in order: 1.0 for as fast as the pool, else how many times slower (> 1)."""
        ...


def resolve_speed_source(plugins: Mapping[str, object], parameter: str, wanted: str) -> SpeedSource:
    """The plugin a ``...SpeedFrom`` parameter names; ValueError (a config error) when it is absent or cannot rate
    the servers' speed."""
    plugin = plugins.get(wanted)
    if plugin is None:
        raise ValueError(f"{parameter} names plugin {wanted!r}, which is not declared")
    if not isinstance(plugin, SpeedSource):
        raise ValueError(
            f"{parameter} names plugin {wanted!r}, which does not rate the servers' speed (a relative-ttft-scorer does)"
        )
    return plugin
