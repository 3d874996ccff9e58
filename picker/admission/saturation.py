"""The pool's saturation, as admission sees it: the configured detector, or the reference default.

A detector answers ``saturation(endpoints)``: ≥ 1.0 means the pool is full. The detectors themselves are
``picker.scheduling.plugins.saturation`` (``utilization-detector``, ``concurrency-detector``), because a
profile may also list them as filters; this module picks the one ``saturationDetector.pluginRef`` names, or a
``utilization-detector`` with the reference defaults.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from picker.endpoints.model import Endpoint
from picker.scheduling.config import SchedulerConfig
from picker.scheduling.framework import PluginContext
from picker.scheduling.plugins import saturation

__all__ = ["DEFAULT_DETECTOR_NAME", "SaturationDetector", "detector_for"]

DEFAULT_DETECTOR_NAME = saturation.UTILIZATION_DETECTOR


@runtime_checkable
class SaturationDetector(Protocol):
    @property
    def type(self) -> str: ...

    @property
    def name(self) -> str: ...

    def saturation(self, endpoints: Sequence[Endpoint]) -> float:
        """The pool's saturation over ``endpoints`` (≥ 1.0: saturated; no endpoints ⇒ 1.0)."""
        ...


def detector_for(config: SchedulerConfig, ctx: PluginContext) -> SaturationDetector:
    """The detector ``saturationDetector.pluginRef`` names, else a default ``utilization-detector``."""
    if config.saturation_detector is not None:
        plugin = config.plugins.get(config.saturation_detector)
        if isinstance(plugin, SaturationDetector):
            return plugin
    return saturation.UtilizationDetector(
        saturation.UTILIZATION_DETECTOR,
        DEFAULT_DETECTOR_NAME,
        saturation.UtilizationParams(),
        saturation.SATURATION_DETECTOR,
        clock=ctx.clock,
    )
