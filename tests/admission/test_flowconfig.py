"""The flowControl section: reference keys, defaults, inheritance from the default band, policy refs, errors."""

from __future__ import annotations

import logging

import pytest

from picker import errors
from picker.admission.flowconfig import DEFAULT_BAND_MAX_BYTES, BandConfig, FlowConfig, parse_flow_config
from picker.scheduling.config import load_config
from tests.scheduling.helpers import HEAD, ctx

LLMD_SAMPLE = """\
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
featureGates:
- flowControl
plugins:
- type: round-robin-fairness-policy
- type: fcfs-ordering-policy
- type: global-strict-fairness-policy
- type: edf-ordering-policy
- type: utilization-detector
- name: limits
  type: static-usage-limit-policy
  parameters: {threshold: 0.9}
- type: queue-scorer
saturationDetector:
  pluginRef: utilization-detector
flowControl:
  maxBytes: 0
  maxRequests: 0
  defaultRequestTTL: "0s"
  usageLimitPolicyPluginRef: limits
  defaultPriorityBand:
    maxBytes: "1Gi"
    maxRequests: 0
    orderingPolicyRef: fcfs-ordering-policy
    fairnessPolicyRef: global-strict-fairness-policy
  priorityBands:
  - priority: 100
    maxBytes: "5Gi"
    maxRequests: 500
    fairnessPolicyRef: round-robin-fairness-policy
  - priority: -1
    maxRequests: "50"
    orderingPolicyRef: edf-ordering-policy
    defaultRequestTTL: 30s
"""


def _flow(text: str) -> FlowConfig:
    config = load_config(text, ctx())
    assert config.feature("flowControl")
    return parse_flow_config(config.flow_control, config.plugins)


def test_llm_d_sample_loads() -> None:
    flow = _flow(LLMD_SAMPLE)
    assert (flow.max_bytes, flow.max_requests, flow.default_ttl_s, flow.ceiling) == (None, None, None, 0.9)
    assert flow.default_band == BandConfig(max_bytes=2**30, max_requests=None)
    assert flow.band(100) == BandConfig(max_bytes=5 * 2**30, max_requests=500, fairness="round-robin-fairness-policy")
    assert flow.band(-1) == BandConfig(max_bytes=2**30, max_requests=50, ordering="edf-ordering-policy", ttl_s=30.0)
    assert flow.band(7) is flow.default_band
    assert (flow.ttl_s(-1), flow.ttl_s(0)) == (30.0, None)


def test_defaults_without_a_section() -> None:
    flow = parse_flow_config(None, {})
    assert flow == FlowConfig()
    assert flow.band(0).max_bytes == DEFAULT_BAND_MAX_BYTES
    assert (flow.band(0).fairness, flow.band(0).ordering) == ("global-strict-fairness-policy", "fcfs-ordering-policy")
    assert flow.ceiling == 1.0


def test_global_limits_and_ttl() -> None:
    flow = parse_flow_config({"maxBytes": "2Gi", "maxRequests": "1k", "defaultRequestTTL": "1m30s"}, {})
    assert (flow.max_bytes, flow.max_requests, flow.default_ttl_s) == (2 * 2**30, 1000, 90.0)
    assert flow.ttl_s(3) == 90.0


def test_undeclared_policy_types_are_accepted_by_type_name() -> None:
    flow = parse_flow_config({"defaultPriorityBand": {"fairnessPolicyRef": "round-robin-fairness-policy"}}, {})
    assert flow.band(0).fairness == "round-robin-fairness-policy"


def test_a_declared_usage_limit_policy_sets_the_ceiling() -> None:
    text = HEAD + "plugins:\n- type: static-usage-limit-policy\n  parameters: {threshold: 0.75}\n"
    config = load_config(text, ctx())
    assert parse_flow_config({}, config.plugins).ceiling == 0.75


def test_unknown_keys_are_warned_once(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        parse_flow_config({"maxBytes": 10, "enableEviction": True, "priorityBands": [{"priority": 1, "x": 1}]}, {})
    text = caplog.text
    assert "flowControl: ignoring unknown keys: enableEviction" in text
    assert "flowControl.priorityBands[0]: ignoring unknown keys: x" in text


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"maxBytes": "lots"}, "maxBytes"),
        ({"defaultRequestTTL": "soon"}, "defaultRequestTTL"),
        ({"priorityBands": [{"maxBytes": 1}]}, "has no priority"),
        ({"priorityBands": [{"priority": 1}, {"priority": 1}]}, "priority 1 given twice"),
        ({"defaultPriorityBand": {"fairnessPolicyRef": "fcfs-ordering-policy"}}, "not a fairness-policy"),
        ({"defaultPriorityBand": {"orderingPolicyRef": "lifo-ordering-policy"}}, "not a ordering-policy"),
        ({"usageLimitPolicyPluginRef": "nope"}, "is not declared"),
    ],
)
def test_bad_sections_are_config_errors(raw: dict[str, object], message: str) -> None:
    with pytest.raises(errors.ConfigError, match=message):
        parse_flow_config(raw, {})


def test_slo_deadline_ordering_is_accepted_by_name() -> None:
    flow = parse_flow_config({"defaultPriorityBand": {"orderingPolicyRef": "slo-deadline-ordering-policy"}}, {})
    assert flow.band(0).ordering == "slo-deadline-ordering-policy"
