"""EndpointPickerConfig loading: reference YAML loads unchanged; defaults; clear ConfigErrors."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from picker import errors
from picker.scheduling.config import DEFAULT_CONFIG_TEXT, SchedulerConfig, load_config, load_config_file
from picker.scheduling.plugins import datalayer, saturation
from picker.scheduling.plugins.latency import LatencyScorer
from picker.scheduling.plugins.prefix import PrefixCacheScorer
from picker.scheduling.spec import ConfiguredPlugin
from tests.scheduling.helpers import HEAD, INTEGRATION, ctx

LLMD_HEAD = "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\n"

LLMD_PD = (
    LLMD_HEAD
    + """\
plugins:
- type: prefix-cache-scorer
  parameters:
    maxPrefixBlocksToMatch: 256
    lruCapacityPerServer: 31250
- type: queue-scorer
- type: prefill-filter
- type: decode-filter
- type: max-score-picker
- type: prefix-based-pd-decider
  parameters:
    nonCachedTokens: 16
- type: disagg-profile-handler
  parameters:
    deciders:
      prefill: prefix-based-pd-decider
schedulingProfiles:
- name: prefill
  plugins:
  - pluginRef: prefill-filter
  - pluginRef: prefix-cache-scorer
    weight: 2
  - pluginRef: queue-scorer
    weight: 1
  - pluginRef: max-score-picker
- name: decode
  plugins:
  - pluginRef: decode-filter
  - pluginRef: prefix-cache-scorer
    weight: 2
  - pluginRef: queue-scorer
    weight: 1
  - pluginRef: max-score-picker
"""
)

LLMD_PRECISE = (
    LLMD_HEAD
    + """\
plugins:
- type: token-producer
  parameters:
    modelName: Qwen/Qwen3-32B
    vllm:
      http: http://localhost:8000
- type: endpoint-notification-source
- type: metrics-data-source
- type: core-metrics-extractor
- type: single-profile-handler
- type: decode-filter
- type: precise-prefix-cache-scorer
  parameters:
    tokenProcessorConfig:
      blockSize: 64
- type: kv-cache-utilization-scorer
- type: queue-scorer
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: decode-filter
  - pluginRef: precise-prefix-cache-scorer
    weight: 2.0
  - pluginRef: kv-cache-utilization-scorer
    weight: 1.0
  - pluginRef: queue-scorer
    weight: 1.0
  - pluginRef: max-score-picker
"""
)

# The P/D sample's approximate-prefix and queue parts, which use only built types, on the llm-d apiVersion.
LLMD_BUILT_ONLY = (
    LLMD_HEAD
    + """\
plugins:
- type: prefix-cache-scorer
  parameters:
    maxPrefixBlocksToMatch: 256
    lruCapacityPerServer: 31250
- type: queue-scorer
- type: endpoint-notification-source
- type: metrics-data-source
- type: core-metrics-extractor
- type: single-profile-handler
- type: max-score-picker
dataLayer:
  sources:
  - pluginRef: metrics-data-source
    extractors:
    - pluginRef: core-metrics-extractor
  - pluginRef: endpoint-notification-source
    extractors:
    - pluginRef: prefix-cache-scorer
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: prefix-cache-scorer
    weight: 2.0
  - pluginRef: queue-scorer
    weight: 1.0
  - pluginRef: max-score-picker
"""
)


def _weights(config: SchedulerConfig, profile: str = "default") -> dict[str, float]:
    return dict(config.profiles[profile].weights)


def _load(text: str) -> SchedulerConfig:
    return load_config(text, ctx())


# -- reference configurations -------------------------------------------------------------------------------


def test_builtin_default_is_the_server_model() -> None:
    # picker's default (docs/scheduling.md, "The default: the server model"): latency-scorer alone in the profile,
    # its prefix term from the declared prefix-cache-scorer's index; the reference default and picker's previous
    # one stay loadable as plain config text (next tests).
    config = load_config(None, ctx())
    assert list(config.profiles) == ["default"]
    assert _weights(config) == {"latency-scorer": 1.0}
    latency = config.plugins["latency-scorer"]
    assert isinstance(latency, LatencyScorer)
    assert isinstance(config.plugins["prefix-cache-scorer"], PrefixCacheScorer)
    assert latency._prefix is config.plugins["prefix-cache-scorer"]  # bound by prefixFrom
    profile = config.profiles["default"]
    assert profile.picker.type == "max-score-picker"
    assert profile.filters == ()
    assert config.profile_handler.type == "single-profile-handler"
    assert config.parser == "openai-parser"
    assert config.source == "built-in default"
    assert [(d.plugin_ref, d.extractors) for d in config.data_sources] == [
        ("metrics-data-source", ("core-metrics-extractor",))
    ]
    source = config.plugins["metrics-data-source"]
    assert isinstance(source, ConfiguredPlugin)
    assert source.kind == "data-source"
    assert source.params == datalayer.MetricsSourceParams()


def test_reference_default_still_loads() -> None:
    reference = DEFAULT_CONFIG_TEXT.split("plugins:")[0] + (
        "plugins:\n- type: queue-scorer\n- type: kv-cache-utilization-scorer\n- type: prefix-cache-scorer\n"
        "schedulingProfiles:\n- name: default\n  plugins:\n  - pluginRef: queue-scorer\n    weight: 2\n"
        "  - pluginRef: kv-cache-utilization-scorer\n    weight: 2\n  - pluginRef: prefix-cache-scorer\n    weight: 3\n"
    )
    assert _weights(_load(reference)) == {
        "queue-scorer": 2.0, "kv-cache-utilization-scorer": 2.0, "prefix-cache-scorer": 3.0
    }  # fmt: skip


def test_default_text_loads_the_same() -> None:
    config = _load(DEFAULT_CONFIG_TEXT)
    assert _weights(config) == _weights(load_config(None, ctx()))
    assert config.source == "config text"


def test_integration_test_config() -> None:
    config = _load(INTEGRATION)
    assert _weights(config) == {
        "queue-scorer": 1.0,
        "kv-cache-utilization-scorer": 1.0,
        "prefix-cache-scorer": 1.0,
        "lora-affinity-scorer": 1.0,
    }
    assert config.feature("enableLegacyMetrics")
    assert not config.feature("flowControl")


def test_llm_d_api_version_with_built_types() -> None:
    config = _load(LLMD_BUILT_ONLY)
    assert config.api_version == "llm-d.ai/v1alpha1"
    assert _weights(config) == {"prefix-cache-scorer": 2.0, "queue-scorer": 1.0}
    scorer = config.plugins["prefix-cache-scorer"]
    assert scorer.params.lru_capacity_per_server == 31250
    assert config.data_sources[1].extractors == ("prefix-cache-scorer",)
    assert [p.name for p in config.configured("data-source")] == ["endpoint-notification-source", "metrics-data-source"]


def test_llm_d_precise_sample_loads() -> None:
    config = _load(LLMD_PRECISE)
    weights = {"precise-prefix-cache-scorer": 2.0, "kv-cache-utilization-scorer": 1.0, "queue-scorer": 1.0}
    assert _weights(config) == weights
    scorer = config.plugins["precise-prefix-cache-scorer"]
    assert scorer.params.token_processor_config.tokens_per_block == 64
    (producer,) = config.configured("token-producer")
    assert producer.params.vllm.http == "http://localhost:8000"


# Both llm-d samples' plugin types are built now (the precise path in issue 9, P/D in issue 10): a sample naming a
# type picker does not build still fails with the type's name and the known types.
UNBUILT = "made-up-pd-decider"


@pytest.mark.parametrize(("text", "unknown"), [(LLMD_PD.replace("prefix-based-pd-decider", UNBUILT), UNBUILT)])
def test_llm_d_samples_with_unbuilt_types_name_the_type(text: str, unknown: str) -> None:
    with pytest.raises(errors.ConfigError) as info:
        _load(text)
    message = str(info.value)
    assert f"unknown plugin type {unknown!r}" in message
    assert "known types:" in message
    assert "queue-scorer" in message
    assert "max-score-picker" in message


# -- defaults -----------------------------------------------------------------------------------------------


def test_no_profiles_makes_one_default_profile_with_everything() -> None:
    config = _load(
        HEAD + "plugins:\n- type: queue-scorer\n- type: lora-affinity-scorer\n- type: random-picker\n"
        "- type: metrics-data-source\n"
    )
    assert list(config.profiles) == ["default"]
    assert _weights(config) == {"queue-scorer": 1.0, "lora-affinity-scorer": 1.0}
    assert config.profiles["default"].picker.type == "random-picker"


def test_names_default_to_types_and_instances_can_share_a_type() -> None:
    config = _load(
        HEAD
        + """\
plugins:
- type: queue-scorer
- name: queue-again
  type: queue-scorer
- name: top3
  type: max-score-picker
  parameters: {maxNumOfEndpoints: 3}
schedulingProfiles:
- name: main
  plugins:
  - pluginRef: queue-scorer
    weight: 2
  - pluginRef: queue-again
    weight: 0.5
  - pluginRef: top3
"""
    )
    assert _weights(config, "main") == {"queue-scorer": 2.0, "queue-again": 0.5}
    picker = config.profiles["main"].picker
    assert picker.name == "top3"
    assert picker._count == 3


def test_feature_gates_detector_parser_flow_control_are_kept() -> None:
    config = _load(
        HEAD
        + """\
featureGates: [flowControl]
plugins:
- type: queue-scorer
- name: detector
  type: utilization-detector
  parameters: {queueDepthThreshold: 8, kvCacheUtilThreshold: 0.9}
- type: passthrough-parser
saturationDetector: {pluginRef: detector}
parser: {pluginRef: passthrough-parser}
flowControl: {maxBytes: 1000, priorityBands: [{priority: 1}]}
"""
    )
    assert config.feature("flowControl")
    assert config.saturation_detector == "detector"
    detector = config.plugins["detector"]
    assert isinstance(detector, ConfiguredPlugin)
    assert detector.params == saturation.UtilizationParams(queue_depth_threshold=8, kv_cache_util_threshold=0.9)
    assert config.parser == "passthrough-parser"
    assert config.flow_control["maxBytes"] == 1000


def test_feature_gates_as_a_mapping() -> None:
    config = _load(
        HEAD + "featureGates: {flowControl: true, enableLegacyMetrics: false}\nplugins: [{type: queue-scorer}]\n"
    )
    assert config.feature_gates == frozenset({"flowControl"})


def test_data_key_is_accepted_for_data_layer() -> None:
    config = _load(
        HEAD + "plugins:\n- type: queue-scorer\n- type: metrics-data-source\n"
        "data:\n  sources:\n  - pluginRef: metrics-data-source\n"
    )
    assert config.data_sources[0].plugin_ref == "metrics-data-source"


def test_core_metrics_extractor_engine_configs_are_typed() -> None:
    config = _load(
        HEAD
        + """\
plugins:
- type: queue-scorer
- type: core-metrics-extractor
  parameters:
    defaultEngine: sglang
    engineConfigs:
    - name: sglang
      queuedRequestsSpec: "sglang:num_queue_reqs"
      kvUsageSpec: "sglang:token_usage"
"""
    )
    extractor = config.plugins["core-metrics-extractor"]
    assert isinstance(extractor, ConfiguredPlugin)
    params = extractor.params
    assert isinstance(params, datalayer.ExtractorParams)
    assert params.default_engine == "sglang"
    assert params.engine_configs[0].kv_usage_spec == "sglang:token_usage"


def test_unknown_parameter_keys_warn_once_and_are_ignored(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="picker.scheduling.config"):
        config = _load(
            HEAD + "plugins:\n- type: prefix-cache-scorer\n  parameters: {lruCapacityPerServer: 10, "
            "hashSeed: x, blockSizeTokenz: 3}\n"
        )
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "blockSizeTokenz" in warnings[0]
    assert "hashSeed" in warnings[0]
    assert "prefix-cache-scorer" in warnings[0]
    assert config.plugins["prefix-cache-scorer"].params.lru_capacity_per_server == 10


def test_snake_case_parameter_names_are_accepted_too() -> None:
    config = _load(
        HEAD + "plugins:\n- type: max-score-picker\n  parameters: {max_num_of_endpoints: 2}\n- type: queue-scorer\n"
    )
    assert config.profiles["default"].picker._count == 2


def test_config_file(tmp_path: Path) -> None:
    path = tmp_path / "plugins.yaml"
    path.write_text(INTEGRATION)
    config = load_config_file(str(path), ctx())
    assert config.source == str(path)
    assert len(config.profiles["default"].scorers) == 4


# -- errors -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        (
            HEAD + "plugins:\n- type: queue-scorer\n  parameters: {}\n- type: max-score-picker\n"
            "  parameters: {maxNumOfEndpoints: 0}\n",
            "plugin 'max-score-picker' (max-score-picker): invalid parameters",
        ),
        (
            HEAD + "plugins:\n- type: prefix-cache-scorer\n  parameters: {lruCapacityPerServer: lots}\n",
            "lruCapacityPerServer: Input should be a valid integer",
        ),
        (HEAD + "plugins:\n- type: queue-scorer\n- type: queue-scorer\n", "duplicate plugin name 'queue-scorer'"),
        (
            HEAD + "plugins:\n- type: queue-scorer\nschedulingProfiles:\n- name: d\n  plugins:\n  - pluginRef: nope\n",
            "refers to plugin 'nope'",
        ),
        (
            HEAD + "plugins:\n- type: queue-scorer\nschedulingProfiles:\n- name: d\n  plugins:\n"
            "  - pluginRef: queue-scorer\n    weight: -1\n",
            "invalid EndpointPickerConfig",
        ),
        (
            HEAD + "plugins:\n- type: random-picker\n- type: max-score-picker\nschedulingProfiles:\n- name: d\n"
            "  plugins:\n  - pluginRef: random-picker\n  - pluginRef: max-score-picker\n",
            "has two pickers",
        ),
        (
            HEAD + "plugins:\n- type: queue-scorer\nschedulingProfiles:\n- name: a\n  plugins: []\n- name: b\n"
            "  plugins: []\n",
            "runs exactly one scheduling profile",
        ),
        (
            HEAD + "plugins:\n- type: queue-scorer\n- type: metrics-data-source\nschedulingProfiles:\n- name: d\n"
            "  plugins:\n  - pluginRef: metrics-data-source\n",
            "not a filter, scorer or picker",
        ),
        (
            HEAD + "plugins:\n- type: queue-scorer\nsaturationDetector: {pluginRef: queue-scorer}\n",
            "not a saturation-detector",
        ),
        (HEAD + "plugins:\n- type: queue-scorer\nparser: {pluginRef: missing}\n", "refers to plugin 'missing'"),
        (
            HEAD + "plugins:\n- type: queue-scorer\ndataLayer:\n  sources:\n  - pluginRef: nothing\n",
            "dataLayer.sources refers to plugin 'nothing'",
        ),
        (
            HEAD + "plugins:\n- type: single-profile-handler\n- name: other\n  type: single-profile-handler\n",
            "more than one profile handler",
        ),
        ("apiVersion: v1\nkind: EndpointPickerConfig\n", "unsupported apiVersion 'v1'"),
        ("apiVersion: llm-d.ai/v1alpha1\nkind: ConfigMap\n", "unsupported kind 'ConfigMap'"),
        ("kind: EndpointPickerConfig\n", "invalid EndpointPickerConfig: apiVersion"),
        ("plugins: [", "not valid YAML"),
        ("- a\n- b\n", "expected an EndpointPickerConfig mapping"),
        ("", "expected an EndpointPickerConfig mapping"),
        (HEAD + "plugins:\n- name: x\n", "plugins.0.type"),
        (HEAD + "plugins:\n- type: queue-scorer\n  parameters: [1]\n", "plugins.0.parameters"),
    ],
)
def test_config_errors(text: str, fragment: str) -> None:
    with pytest.raises(errors.ConfigError) as info:
        _load(text)
    assert fragment in str(info.value)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(errors.ConfigError, match="cannot read config file"):
        load_config_file(str(tmp_path / "absent.yaml"), ctx())


def test_unknown_top_level_keys_warn(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="picker.scheduling.config"):
        _load(INTEGRATION + "somethingNew: true\n")
    assert any("somethingNew" in r.getMessage() for r in caplog.records)


def test_weight_on_a_picker_is_ignored_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="picker.scheduling.config"):
        config = _load(
            HEAD + "plugins:\n- type: queue-scorer\n- type: max-score-picker\nschedulingProfiles:\n"
            "- name: d\n  plugins:\n  - pluginRef: queue-scorer\n  - pluginRef: max-score-picker\n"
            "    weight: 3\n"
        )
    assert config.profiles["d"].picker.type == "max-score-picker"
    assert any("not a scorer" in r.getMessage() for r in caplog.records)


def test_the_pd_lab_runs_llm_d_s_own_sample() -> None:
    """``picker bench lab-pd`` templates llm-d's P/D sample; with the sample's decider it is the sample, verbatim."""
    from picker.bench.lab_pd import pd_config

    assert pd_config("prefix:16") == LLMD_PD
