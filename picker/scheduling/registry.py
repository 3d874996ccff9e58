"""The one explicit table of built-in plugin types: type name → PluginSpec.

Adding a plugin: write its module under ``plugins/`` (``TYPE``, ``Params``, ``create``, ``SPEC``) and list its
``SPEC`` here. No import-time registration.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from picker.scheduling.plugins import (
    datalayer,
    kv_cache,
    lora,
    max_score,
    parsers,
    prefix,
    queue,
    random_picker,
    running,
    saturation,
    single_profile,
    weighted_random,
)
from picker.scheduling.spec import PluginSpec

__all__ = ["BUILTINS", "known_types", "lookup"]

BUILTINS: Mapping[str, PluginSpec[Any]] = MappingProxyType(
    {
        s.type: s
        for s in (
            # scorers
            queue.SPEC,
            running.SPEC,
            kv_cache.SPEC,
            prefix.SPEC,
            lora.SPEC,
            # pickers
            max_score.SPEC,
            random_picker.SPEC,
            weighted_random.SPEC,
            # profile handlers
            single_profile.SPEC,
            # accepted, kept for other packages
            datalayer.METRICS_SPEC,
            datalayer.EXTRACTOR_SPEC,
            datalayer.NOTIFICATION_SPEC,
            saturation.UTILIZATION_SPEC,
            saturation.CONCURRENCY_SPEC,
            parsers.OPENAI_SPEC,
            parsers.PASSTHROUGH_SPEC,
        )
    }
)


def lookup(type_name: str) -> PluginSpec[Any] | None:
    return BUILTINS.get(type_name)


def known_types() -> list[str]:
    return sorted(BUILTINS)
