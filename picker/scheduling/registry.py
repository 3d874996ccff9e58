"""The one explicit table of built-in plugin types: type name → PluginSpec.

Adding a plugin: write its module under ``plugins/`` (``TYPE``, ``Params``, ``create``, ``SPEC``) and list its
``SPEC`` here. No import-time registration.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from picker.scheduling.plugins import (
    active_request,
    by_label,
    datalayer,
    disagg_handler,
    disagg_headers,
    flow_policies,
    header_testing,
    kv_cache,
    label_selector,
    latency,
    lmetric,
    load_aware,
    lora,
    max_score,
    no_hit_lru,
    parsers,
    pd_deciders,
    picker_load,
    precise_prefix,
    prefix,
    queue,
    random_picker,
    roles,
    running,
    saturation,
    session_affinity,
    single_profile,
    token_load,
    token_producer,
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
            precise_prefix.SPEC,
            lora.SPEC,
            token_load.SPEC,
            latency.SPEC,
            load_aware.SPEC,
            active_request.SPEC,
            session_affinity.SPEC,
            no_hit_lru.SPEC,
            picker_load.SPEC,
            lmetric.SPEC,
            # filters (the saturation detectors below are filters too)
            label_selector.SPEC,
            label_selector.BY_LABEL_SELECTOR_SPEC,
            by_label.SPEC,
            roles.SPEC,
            roles.PREFILL_SPEC,
            roles.ENCODE_SPEC,
            header_testing.SPEC,
            # pickers
            max_score.SPEC,
            random_picker.SPEC,
            weighted_random.SPEC,
            # profile handlers, and the P/D deciders and header plugins they use
            single_profile.SPEC,
            disagg_handler.SPEC,
            disagg_handler.LEGACY_SPEC,
            pd_deciders.SPEC,
            pd_deciders.ALWAYS_SPEC,
            pd_deciders.PROMPT_LENGTH_SPEC,
            pd_deciders.MULTIMODAL_SPEC,
            disagg_headers.SPEC,
            disagg_headers.LEGACY_SPEC,
            # accepted, kept for other packages
            datalayer.METRICS_SPEC,
            datalayer.EXTRACTOR_SPEC,
            datalayer.NOTIFICATION_SPEC,
            saturation.UTILIZATION_SPEC,
            saturation.CONCURRENCY_SPEC,
            parsers.OPENAI_SPEC,
            parsers.PASSTHROUGH_SPEC,
            flow_policies.SPEC,
            flow_policies.ROUND_ROBIN_SPEC,
            flow_policies.FCFS_SPEC,
            flow_policies.EDF_SPEC,
            flow_policies.SLO_DEADLINE_SPEC,
            flow_policies.STATIC_USAGE_LIMIT_SPEC,
            token_producer.SPEC,
        )
    }
)


def lookup(type_name: str) -> PluginSpec[Any] | None:
    return BUILTINS.get(type_name)


def known_types() -> list[str]:
    return sorted(BUILTINS)
