"""Saturation detectors: ``utilization-detector`` and ``concurrency-detector`` (scheduling.md §8).

Each is a configured plugin of kind ``saturation-detector`` (named by ``saturationDetector.pluginRef``; admission
asks it for the pool's saturation, ``picker.admission``) and also a Filter a profile may list, as the
reference's are. Saturation ≥ 1.0 means the pool is full. Defaults are the reference's.

``utilization-detector``: per endpoint max(waiting / ``queueDepthThreshold``, kv / ``kvCacheUtilThreshold``);
metrics older than ``metricsStalenessThreshold`` (or never scraped) ⇒ 1.0; pool = mean over the endpoints; none
⇒ 1.0. As a filter it keeps fresh endpoints with waiting < queueDepthThreshold * (1 + ``headroom``) and
kv < kvCacheUtilThreshold * (1 + headroom); when none pass it keeps them all (fail open).
Parameters: ``queueDepthThreshold`` 5 (> 0), ``kvCacheUtilThreshold`` 0.8 (in (0, 1]),
``metricsStalenessThreshold`` "200ms" (> 0; a Go duration or seconds), ``headroom`` 0.0.

``concurrency-detector``: picker's own in-flight count per endpoint (requests, or tokens with
``concurrencyMode: tokens``); pool = Σ in-flight / (N * capacity), capacity ``maxConcurrency`` 100 requests or
``maxTokenConcurrency`` 1 000 000 tokens; none ⇒ 1.0. As a filter it keeps endpoints with in-flight <
capacity * (1 + ``headroom``), possibly none. Exact and immediate, but blind to traffic picker did not route.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal, cast

from pydantic import Field, field_validator

from picker.plugins import CycleState, Endpoint, InferenceRequest, LoadView, PluginContext, PluginParams
from picker.scheduling.spec import ConfiguredPlugin, PluginSpec
from picker.scheduling.units import duration_s

__all__ = [
    "CONCURRENCY_DETECTOR",
    "CONCURRENCY_SPEC",
    "SATURATION_DETECTOR",
    "UTILIZATION_DETECTOR",
    "UTILIZATION_SPEC",
    "ConcurrencyDetector",
    "ConcurrencyParams",
    "UtilizationDetector",
    "UtilizationParams",
]

UTILIZATION_DETECTOR = "utilization-detector"
CONCURRENCY_DETECTOR = "concurrency-detector"
SATURATION_DETECTOR = "saturation-detector"


class UtilizationParams(PluginParams):
    queue_depth_threshold: int = Field(default=5, gt=0)
    kv_cache_util_threshold: float = Field(default=0.8, gt=0.0, le=1.0)
    metrics_staleness_threshold: float = Field(default=0.2, gt=0.0)  # seconds; YAML may say "200ms"
    headroom: float = Field(default=0.0, ge=0.0)

    @field_validator("metrics_staleness_threshold", mode="before")
    @classmethod
    def _duration(cls, value: object) -> float:
        return duration_s(value)


class ConcurrencyParams(PluginParams):
    concurrency_mode: Literal["requests", "tokens"] = "requests"
    max_concurrency: int = Field(default=100, ge=1)
    max_token_concurrency: int = Field(default=1_000_000, ge=1)
    headroom: float = Field(default=0.0, ge=0.0)


@dataclass(frozen=True, slots=True)
class UtilizationDetector(ConfiguredPlugin):
    """``utilization-detector``: scraped queue and KV use against thresholds."""

    clock: Callable[[], float] = field(default=time.monotonic, compare=False, repr=False)

    @property
    def settings(self) -> UtilizationParams:
        return cast(UtilizationParams, self.params)

    def endpoint_saturation(self, endpoint: Endpoint, now: float) -> float:
        p = self.settings
        m = endpoint.metrics
        if m.updated_at <= 0.0 or now - m.updated_at > p.metrics_staleness_threshold:
            return 1.0
        return max(m.waiting / p.queue_depth_threshold, m.kv_usage / p.kv_cache_util_threshold)

    def saturation(self, endpoints: Sequence[Endpoint]) -> float:
        if not endpoints:
            return 1.0
        now = self.clock()
        return sum(self.endpoint_saturation(e, now) for e in endpoints) / len(endpoints)

    def filter(self, req: InferenceRequest, endpoints: Sequence[Endpoint], cycle: CycleState) -> Sequence[Endpoint]:
        p = self.settings
        burst = 1.0 + p.headroom
        queue_limit, kv_limit = p.queue_depth_threshold * burst, p.kv_cache_util_threshold * burst
        oldest = self.clock() - p.metrics_staleness_threshold
        kept = [
            e
            for e in endpoints
            if e.metrics.updated_at > 0.0
            and e.metrics.updated_at >= oldest
            and e.metrics.waiting < queue_limit
            and e.metrics.kv_usage < kv_limit
        ]
        return kept or endpoints


@dataclass(frozen=True, slots=True)
class ConcurrencyDetector(ConfiguredPlugin):
    """``concurrency-detector``: picker's own in-flight requests or tokens against a per-endpoint capacity."""

    load: Callable[[Endpoint], LoadView] | None = field(default=None, compare=False, repr=False)

    @property
    def settings(self) -> ConcurrencyParams:
        return cast(ConcurrencyParams, self.params)

    @property
    def capacity(self) -> int:
        p = self.settings
        return p.max_token_concurrency if p.concurrency_mode == "tokens" else p.max_concurrency

    def inflight(self, endpoint: Endpoint) -> int:
        if self.load is None:
            return 0
        view = self.load(endpoint)
        return view.tokens if self.settings.concurrency_mode == "tokens" else view.requests

    def saturation(self, endpoints: Sequence[Endpoint]) -> float:
        if not endpoints:
            return 1.0
        return sum(self.inflight(e) for e in endpoints) / (len(endpoints) * self.capacity)

    def filter(self, req: InferenceRequest, endpoints: Sequence[Endpoint], cycle: CycleState) -> Sequence[Endpoint]:
        limit = self.capacity * (1.0 + self.settings.headroom)
        return [e for e in endpoints if self.inflight(e) < limit]


def _utilization(name: str, params: UtilizationParams, ctx: PluginContext) -> UtilizationDetector:
    return UtilizationDetector(UTILIZATION_DETECTOR, name, params, SATURATION_DETECTOR, clock=ctx.clock)


def _concurrency(name: str, params: ConcurrencyParams, ctx: PluginContext) -> ConcurrencyDetector:
    return ConcurrencyDetector(CONCURRENCY_DETECTOR, name, params, SATURATION_DETECTOR, load=ctx.load)


UTILIZATION_SPEC = PluginSpec(UTILIZATION_DETECTOR, UtilizationParams, _utilization, kind=SATURATION_DETECTOR)
CONCURRENCY_SPEC = PluginSpec(CONCURRENCY_DETECTOR, ConcurrencyParams, _concurrency, kind=SATURATION_DETECTOR)
