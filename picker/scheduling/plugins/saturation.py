"""Saturation-detector plugin types: accepted in a config, parameters typed and kept for admission.

Referenced by ``saturationDetector.pluginRef``; the admission package builds the detector from these values
(scheduling.md §8). Defaults are the reference's.

* ``utilization-detector``: ``queueDepthThreshold`` 5, ``kvCacheUtilThreshold`` 0.8,
  ``metricsStalenessThreshold`` "200ms", ``headroom`` 0.0.
* ``concurrency-detector``: ``concurrencyMode`` requests|tokens, ``maxConcurrency`` 100,
  ``maxTokenConcurrency`` 1 000 000, ``headroom`` 0.0.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from picker.plugins import PluginContext, PluginParams
from picker.scheduling.spec import ConfiguredPlugin, PluginSpec

__all__ = [
    "CONCURRENCY_DETECTOR",
    "CONCURRENCY_SPEC",
    "UTILIZATION_DETECTOR",
    "UTILIZATION_SPEC",
    "ConcurrencyParams",
    "UtilizationParams",
]

UTILIZATION_DETECTOR = "utilization-detector"
CONCURRENCY_DETECTOR = "concurrency-detector"


class UtilizationParams(PluginParams):
    queue_depth_threshold: int = Field(default=5, ge=0)
    kv_cache_util_threshold: float = Field(default=0.8, ge=0.0)
    metrics_staleness_threshold: str | float = "200ms"  # a Go duration string, or seconds
    headroom: float = Field(default=0.0, ge=0.0)


class ConcurrencyParams(PluginParams):
    concurrency_mode: Literal["requests", "tokens"] = "requests"
    max_concurrency: int = Field(default=100, ge=1)
    max_token_concurrency: int = Field(default=1_000_000, ge=1)
    headroom: float = Field(default=0.0, ge=0.0)


def _utilization(name: str, params: UtilizationParams, ctx: PluginContext) -> ConfiguredPlugin:
    return ConfiguredPlugin(UTILIZATION_DETECTOR, name, params, "saturation-detector")


def _concurrency(name: str, params: ConcurrencyParams, ctx: PluginContext) -> ConfiguredPlugin:
    return ConfiguredPlugin(CONCURRENCY_DETECTOR, name, params, "saturation-detector")


UTILIZATION_SPEC = PluginSpec(UTILIZATION_DETECTOR, UtilizationParams, _utilization, kind="saturation-detector")
CONCURRENCY_SPEC = PluginSpec(CONCURRENCY_DETECTOR, ConcurrencyParams, _concurrency, kind="saturation-detector")
