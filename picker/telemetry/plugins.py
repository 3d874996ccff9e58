"""Metrics of user plugins' isolation: dropped contributions and cool-downs (picker's own names).

A user plugin (loaded from a config ``type: module:Class`` or an entry point) whose call raises, returns an
invalid value or runs over its time budget has its contribution dropped for that cycle; each drop counts here.
Per-call latency of every plugin, built-in or not, is the reference ``inference_extension_plugin_duration_seconds``
(``metrics.PLUGIN_DURATION``).
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge

from picker.telemetry import REGISTRY

__all__ = ["PLUGIN_DISABLED", "PLUGIN_ERRORS", "REASONS"]

# Why a contribution was dropped: the call raised, returned something the score/filter/pick contract refuses,
# or took longer than its budget.
REASONS = ("error", "invalid", "budget")

# prometheus_client appends ``_total`` to counter names itself.
PLUGIN_ERRORS = Counter(
    "picker_plugin_errors",
    "User plugin calls whose result was dropped, by reason: error (raised), invalid (bad result), "
    "budget (over its time budget).",
    ("plugin_type", "plugin_name", "reason"),
    registry=REGISTRY,
)
PLUGIN_DISABLED = Gauge(
    "picker_plugin_disabled",
    "1 while a user plugin is not called, cooling down after consecutive time-budget overruns.",
    ("plugin_type", "plugin_name"),
    registry=REGISTRY,
)
