"""disagg-profile-handler / pd-profile-handler: decode first, prefill when the decider says so, headers, metric."""

from __future__ import annotations

import pytest

from picker import errors
from picker.endpoints.model import Endpoint
from picker.request import headers as hdr
from picker.scheduling.config import load_config
from picker.scheduling.plugins.disagg_handler import DisaggProfileHandler
from picker.scheduling.scheduler import Scheduler
from picker.telemetry import REGISTRY
from tests.conftest import endpoint, request
from tests.scheduling.helpers import ctx

LLMD_HEAD = "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\n"

PROFILES = """\
schedulingProfiles:
- name: prefill
  plugins:
  - pluginRef: prefill-filter
  - pluginRef: prefix-cache-scorer
    weight: 2
  - pluginRef: queue-scorer
    weight: 1
- name: decode
  plugins:
  - pluginRef: decode-filter
  - pluginRef: prefix-cache-scorer
    weight: 2
  - pluginRef: queue-scorer
    weight: 1
"""


PREFIX_DECIDER = "- type: prefix-based-pd-decider\n  parameters:\n    nonCachedTokens: 16\n"


def _config(handler: str, decider: str = PREFIX_DECIDER) -> str:
    return (
        LLMD_HEAD
        + "plugins:\n- type: prefix-cache-scorer\n- type: queue-scorer\n- type: prefill-filter\n- type: decode-filter\n"
        + decider
        + handler
        + PROFILES
    )


PD = _config("- type: disagg-profile-handler\n  parameters:\n    deciders:\n      prefill: prefix-based-pd-decider\n")

ROLE = "llm-d.ai/role"
PREFILL = [endpoint(1, labels={ROLE: "prefill"}), endpoint(2, waiting=3, labels={ROLE: "prefill"})]
DECODE = [endpoint(3, labels={ROLE: "decode"}), endpoint(4, waiting=2, labels={ROLE: "decode"})]
LONG = "word " * 800  # 4000 bytes: 1000 tokens by llm-d's estimate


def _scheduler(text: str) -> Scheduler:
    c = ctx()
    return Scheduler(load_config(text, c), c)


def _decisions(decision: str, model: str = "my-model") -> float:
    labels = {"model_name": model, "decision_type": decision}
    return REGISTRY.get_sample_value("llm_d_inference_scheduler_disagg_decision_total", labels) or 0.0


def _keys(eps: list[Endpoint]) -> set[str]:
    return {e.key for e in eps}


def test_a_cold_long_prompt_is_prefilled_on_a_prefill_pod_and_decoded_on_a_decode_pod() -> None:
    scheduler = _scheduler(PD)
    before = _decisions("prefill-decode")
    req = request(prompt=LONG)
    result = scheduler.schedule(req, [*PREFILL, *DECODE])
    assert result.primary_profile == "decode"
    assert result.targets[0].key == DECODE[0].key  # the shorter queue
    prefill = result.profile_results["prefill"]
    assert prefill is not None
    assert prefill.targets[0].key == PREFILL[0].key
    assert scheduler.request_headers(req, result) == {hdr.PREFILLER: PREFILL[0].key}
    assert _decisions("prefill-decode") == before + 1


def test_a_prompt_cached_on_the_decode_pod_is_served_decode_only() -> None:
    scheduler = _scheduler(PD)
    req = request(prompt=LONG)
    first = scheduler.schedule(req, [*PREFILL, *DECODE])
    scheduler.pre_request(req, first)  # the prefix index learns the decode and the prefill targets
    before = _decisions("decode-only")
    again = scheduler.schedule(req, [*PREFILL, *DECODE])
    assert again.targets[0].key == first.targets[0].key
    assert "prefill" not in again.profile_results
    assert scheduler.request_headers(req, again) == {}
    assert _decisions("decode-only") == before + 1
    # A new question after the cached system prompt: the uncached suffix is long enough again.
    longer = request(prompt=LONG + "other " * 100)
    assert scheduler.request_headers(longer, scheduler.schedule(longer, [*PREFILL, *DECODE])) == {
        hdr.PREFILLER: PREFILL[0].key
    }


def test_a_short_prompt_is_not_worth_the_transfer() -> None:
    scheduler = _scheduler(PD)
    req = request(prompt="hi there")  # 2 tokens < nonCachedTokens 16
    result = scheduler.schedule(req, [*PREFILL, *DECODE])
    assert result.targets[0].key in _keys(DECODE)
    assert scheduler.request_headers(req, result) == {}


def test_no_healthy_prefill_pod_falls_back_to_decode_only() -> None:
    scheduler = _scheduler(PD)
    req = request(prompt=LONG)
    result = scheduler.schedule(req, DECODE)  # the prefill pods are stale or gone: not candidates
    assert result.targets[0].key in _keys(DECODE)
    assert result.profile_results["prefill"] is None  # ran, filtered to nothing
    assert scheduler.request_headers(req, result) == {}


def test_no_decode_pod_is_an_error() -> None:
    scheduler = _scheduler(PD)
    with pytest.raises(errors.ResourceExhausted, match="failed to find target endpoint"):
        scheduler.schedule(request(prompt=LONG), PREFILL)


def test_unlabelled_pods_decode_and_both_pods_do_either() -> None:
    scheduler = _scheduler(PD)
    plain = endpoint(5)
    both = endpoint(6, waiting=1, labels={"llm-d.ai/role": "both"})
    req = request(prompt=LONG)
    result = scheduler.schedule(req, [plain, both])
    assert result.targets[0].key == plain.key
    assert scheduler.request_headers(req, result) == {hdr.PREFILLER: both.key}


def test_without_a_prefill_decider_every_request_is_decode_only() -> None:
    scheduler = _scheduler(_config("- type: disagg-profile-handler\n", decider=""))
    req = request(prompt=LONG)
    result = scheduler.schedule(req, [*PREFILL, *DECODE])
    assert "prefill" not in result.profile_results
    assert scheduler.request_headers(req, result) == {}


def test_flat_parameters_and_custom_profile_names() -> None:
    text = (
        LLMD_HEAD
        + """\
plugins:
- type: prefill-filter
- type: decode-filter
- type: always-disagg-pd-decider
- type: disagg-profile-handler
  parameters:
    decodeProfile: d
    prefillProfile: p
    prefillDeciderPluginName: always-disagg-pd-decider
schedulingProfiles:
- name: p
  plugins: [{pluginRef: prefill-filter}]
- name: d
  plugins: [{pluginRef: decode-filter}]
"""
    )
    scheduler = _scheduler(text)
    req = request(prompt="hi")
    result = scheduler.schedule(req, [PREFILL[0], DECODE[0]])
    assert result.primary_profile == "d"
    assert result.targets == (DECODE[0],)
    assert scheduler.request_headers(req, result) == {hdr.PREFILLER: PREFILL[0].key}


LEGACY = (
    "apiVersion: inference.networking.x-k8s.io/v1alpha1\nkind: EndpointPickerConfig\n"
    + """\
plugins:
- type: prefill-header-handler
- type: prefill-filter
- type: decode-filter
- type: queue-scorer
- type: pd-profile-handler
  parameters:
    threshold: {threshold}
    hashBlockSize: 5
schedulingProfiles:
- name: prefill
  plugins:
  - pluginRef: prefill-filter
  - pluginRef: queue-scorer
    weight: 1.0
- name: decode
  plugins:
  - pluginRef: decode-filter
  - pluginRef: queue-scorer
    weight: 1.0
"""
)


@pytest.mark.parametrize(
    ("threshold", "prompt", "disaggregated"), [(0, "hi", True), (100, "hi", False), (100, LONG, True)]
)
def test_legacy_pd_profile_handler_threshold(threshold: int, prompt: str, disaggregated: bool) -> None:
    scheduler = _scheduler(LEGACY.format(threshold=threshold))
    handler = scheduler.config.profile_handler
    assert isinstance(handler, DisaggProfileHandler)
    assert handler.type == "pd-profile-handler"
    req = request(prompt=prompt)
    result = scheduler.schedule(req, [*PREFILL, *DECODE])
    assert result.targets[0].key == DECODE[0].key
    expected = {hdr.PREFILLER: PREFILL[0].key} if disaggregated else {}
    assert scheduler.request_headers(req, result) == expected


@pytest.mark.parametrize(
    ("handler", "message"),
    [
        (
            "- type: disagg-profile-handler\n  parameters:\n    deciders: {prefill: nope}\n",
            "'nope', which is not declared",
        ),
        (
            "- type: disagg-profile-handler\n  parameters:\n    deciders: {prefill: queue-scorer}\n",
            "'queue-scorer', which is not a decider",
        ),
        (
            "- type: disagg-profile-handler\n  parameters:\n    profiles: {decode: main}\n",
            "the decode profile 'main' is not configured",
        ),
        (
            "- type: disagg-profile-handler\n  parameters:\n    decodeProfile: decode\n    deciders: {prefill: x}\n",
            "cannot mix the flat parameters",
        ),
        ("- type: disagg-profile-handler\n  parameters:\n    primaryPort: 8000\n", "primaryPort"),
    ],
)
def test_bad_handler_parameters_are_config_errors(handler: str, message: str) -> None:
    with pytest.raises(errors.ConfigError, match=message):
        _scheduler(_config(handler))


# llm-d's file-discovery P/D example (always disaggregate, random pickers, the deprecated headers plugin listed).
LLMD_ALWAYS = (
    "apiVersion: inference.networking.x-k8s.io/v1alpha1\nkind: EndpointPickerConfig\n"
    + """\
plugins:
  - type: random-picker
  - type: disagg-headers-handler
  - type: decode-filter
  - type: prefill-filter
  - type: always-disagg-pd-decider
  - type: disagg-profile-handler
    parameters:
      deciders:
        prefill: always-disagg-pd-decider

schedulingProfiles:
  - name: decode
    plugins:
      - pluginRef: decode-filter
      - pluginRef: random-picker
  - name: prefill
    plugins:
      - pluginRef: prefill-filter
      - pluginRef: random-picker
"""
)


def test_llm_d_always_disaggregate_sample() -> None:
    scheduler = _scheduler(LLMD_ALWAYS)
    req = request(prompt="hi")
    for _ in range(8):
        result = scheduler.schedule(req, [*PREFILL, *DECODE])
        assert result.targets[0].key in _keys(DECODE)
        headers = scheduler.request_headers(req, result)
        assert headers[hdr.PREFILLER] in _keys(PREFILL)  # both plugins set it, to the same value
