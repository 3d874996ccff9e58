"""Data-layer plugin types: accepted in a config, parameters typed and kept; no scheduling role here.

The scrape package acts on them (``SchedulerConfig.data_sources`` says which source feeds which extractor).

* ``metrics-data-source``: polls each endpoint's Prometheus page. ``scheme`` "http", ``path`` "/metrics",
  ``insecureSkipVerify`` false.
* ``core-metrics-extractor``: maps engine metrics to queue / running / KV / LoRA / cache geometry.
  ``engineLabelKey``, ``defaultEngine``, ``engineConfigs[]`` (``name`` and the metric specs of that engine).
* ``endpoint-notification-source``: endpoint add/remove notifications (llm-d). No parameters.
"""

from __future__ import annotations

from typing import Literal

from picker.plugins import PluginContext, PluginParams
from picker.scheduling.spec import ConfiguredPlugin, PluginSpec

__all__ = [
    "CORE_METRICS_EXTRACTOR",
    "ENDPOINT_NOTIFICATION_SOURCE",
    "EXTRACTOR_SPEC",
    "METRICS_DATA_SOURCE",
    "METRICS_SPEC",
    "NOTIFICATION_SPEC",
    "EngineConfig",
    "ExtractorParams",
    "MetricsSourceParams",
    "NotificationParams",
]

METRICS_DATA_SOURCE = "metrics-data-source"
CORE_METRICS_EXTRACTOR = "core-metrics-extractor"
ENDPOINT_NOTIFICATION_SOURCE = "endpoint-notification-source"


class MetricsSourceParams(PluginParams):
    scheme: Literal["http", "https"] = "http"
    path: str = "/metrics"
    insecure_skip_verify: bool = False


class EngineConfig(PluginParams):
    name: str
    queued_requests_spec: str | None = None
    running_requests_spec: str | None = None
    kv_usage_spec: str | None = None
    lora_spec: str | None = None
    cache_info_spec: str | None = None


class ExtractorParams(PluginParams):
    engine_label_key: str | None = None
    default_engine: str | None = None
    engine_configs: tuple[EngineConfig, ...] = ()


class NotificationParams(PluginParams):
    """No parameters."""


def _metrics(name: str, params: MetricsSourceParams, ctx: PluginContext) -> ConfiguredPlugin:
    return ConfiguredPlugin(METRICS_DATA_SOURCE, name, params, "data-source")


def _extractor(name: str, params: ExtractorParams, ctx: PluginContext) -> ConfiguredPlugin:
    return ConfiguredPlugin(CORE_METRICS_EXTRACTOR, name, params, "extractor")


def _notification(name: str, params: NotificationParams, ctx: PluginContext) -> ConfiguredPlugin:
    return ConfiguredPlugin(ENDPOINT_NOTIFICATION_SOURCE, name, params, "data-source")


METRICS_SPEC = PluginSpec(METRICS_DATA_SOURCE, MetricsSourceParams, _metrics, kind="data-source")
EXTRACTOR_SPEC = PluginSpec(CORE_METRICS_EXTRACTOR, ExtractorParams, _extractor, kind="extractor")
NOTIFICATION_SPEC = PluginSpec(ENDPOINT_NOTIFICATION_SOURCE, NotificationParams, _notification, kind="data-source")
