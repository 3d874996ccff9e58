"""Helpers for scheduling tests: a seeded PluginContext, score extraction by endpoint key."""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Mapping, Sequence

from picker.endpoints.inflight import InflightTracker
from picker.endpoints.model import Endpoint
from picker.scheduling.framework import PluginContext
from tests.conftest import FakeClock


def ctx(seed: int = 7) -> PluginContext:
    return PluginContext(clock=FakeClock(), inflight=InflightTracker(), rng=random.Random(seed))


def by_key(scores: Mapping[Endpoint, float]) -> dict[str, float]:
    return {e.key: round(s, 9) for e, s in scores.items()}


def ids(endpoints: Sequence[Endpoint]) -> list[int]:
    """Reference test numbering: 192.168.1.<i>:port -> i."""
    return [int(e.address.rsplit(".", 1)[1]) for e in endpoints]


def with_cache_geometry(ep: Endpoint, *, block_size: int | None = None, num_gpu_blocks: int | None = None) -> Endpoint:
    metrics = dataclasses.replace(ep.metrics, block_size=block_size, num_gpu_blocks=num_gpu_blocks)
    return dataclasses.replace(ep, metrics=metrics)


HEAD = "apiVersion: inference.networking.x-k8s.io/v1alpha1\nkind: EndpointPickerConfig\n"

# The reference integration tests' configuration (protocol.md §14): queue, kv, prefix, lora, all weight 1.
INTEGRATION = (
    HEAD
    + """\
featureGates: [enableLegacyMetrics]
plugins:
- type: queue-scorer
- type: kv-cache-utilization-scorer
- type: prefix-cache-scorer
- type: lora-affinity-scorer
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: queue-scorer
  - pluginRef: kv-cache-utilization-scorer
  - pluginRef: prefix-cache-scorer
  - pluginRef: lora-affinity-scorer
"""
)
