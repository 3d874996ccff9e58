"""Reference and llm-d sample configurations (scheduling.md §2) that use only built types: they load unchanged
and route as documented."""

from __future__ import annotations

import dataclasses

import pytest

from picker import errors
from picker.plugins import CycleState
from picker.scheduling.config import SchedulerConfig, load_config
from picker.scheduling.framework import Filter
from picker.scheduling.plugins import saturation
from picker.scheduling.scheduler import Scheduler
from tests.conftest import endpoint, request
from tests.scheduling.helpers import HEAD, ctx, ids

LLMD = "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\n"

# llm-d: approximate prefix + load-aware 1:1, behind a decode filter.
APPROX_PREFIX_LOAD_AWARE = (
    LLMD
    + """\
plugins:
- type: decode-filter
- type: prefix-cache-scorer
- type: load-aware-scorer
  parameters:
    threshold: 128
- type: max-score-picker
- type: single-profile-handler
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: decode-filter
  - pluginRef: prefix-cache-scorer
    weight: 1
  - pluginRef: load-aware-scorer
    weight: 1
  - pluginRef: max-score-picker
"""
)

# llm-d: idle-preferring active-request scorer, weight 5, with load-aware weight 5 (two samples in one profile).
ACTIVE_REQUEST = (
    LLMD
    + """\
plugins:
- type: active-request-scorer
  parameters:
    idleThreshold: 2
    maxBusyScore: 0.5
- type: load-aware-scorer
  parameters:
    threshold: 128
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: active-request-scorer
    weight: 5
  - pluginRef: load-aware-scorer
    weight: 5
"""
)

# llm-d's legacy blend: prefix 3, queue 2, kv 2, no-hit-lru 2.
LEGACY_BLEND = (
    LLMD
    + """\
plugins:
- type: prefix-cache-scorer
- type: queue-scorer
- type: kv-cache-utilization-scorer
- type: no-hit-lru-scorer
  parameters:
    lruSize: 2048
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: prefix-cache-scorer
    weight: 3
  - pluginRef: queue-scorer
    weight: 2
  - pluginRef: kv-cache-utilization-scorer
    weight: 2
  - pluginRef: no-hit-lru-scorer
    weight: 2
"""
)

# Token-aware routing's load half: token-load-scorer + max-score-picker (the affinity filter is not built).
TOKEN_LOAD = (
    LLMD
    + """\
plugins:
- type: token-load-scorer
- type: session-affinity-scorer
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: session-affinity-scorer
    weight: 10
  - pluginRef: token-load-scorer
  - pluginRef: max-score-picker
"""
)

# GIE: the reference default plus an explicit utilization detector, also used as a filter.
GIE_WITH_DETECTOR = (
    HEAD
    + """\
plugins:
- type: queue-scorer
- type: kv-cache-utilization-scorer
- type: prefix-cache-scorer
- type: utilization-detector
  parameters:
    queueDepthThreshold: 5
    kvCacheUtilThreshold: 0.8
    metricsStalenessThreshold: 200ms
saturationDetector:
  pluginRef: utilization-detector
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: utilization-detector
  - pluginRef: queue-scorer
    weight: 2
  - pluginRef: kv-cache-utilization-scorer
    weight: 2
  - pluginRef: prefix-cache-scorer
    weight: 3
"""
)

# The conformance EPP's scheduler: header-based-testing-filter only.
CONFORMANCE = HEAD + "plugins:\n- type: header-based-testing-filter\n- type: max-score-picker\n"

LABELS = (
    LLMD
    + """\
plugins:
- type: by-label-selector
  name: gpu-a100
  parameters:
    matchLabels: {gpu: a100}
    matchExpressions:
    - {key: llm-d.ai/role, operator: NotIn, values: [prefill]}
- type: by-label
  parameters: {label: zone, validValues: [a, b], allowsNoLabel: true}
- type: queue-scorer
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: gpu-a100
  - pluginRef: by-label
  - pluginRef: queue-scorer
"""
)


def _scheduler(text: str) -> tuple[Scheduler, SchedulerConfig]:
    c = ctx()
    config = load_config(text, c)
    return Scheduler(config, c), config


def test_approximate_prefix_with_load_aware_behind_decode_filter() -> None:
    scheduler, config = _scheduler(APPROX_PREFIX_LOAD_AWARE)
    assert dict(config.profiles["default"].weights) == {"prefix-cache-scorer": 1.0, "load-aware-scorer": 1.0}
    eps = [
        endpoint(1, waiting=0, labels={"llm-d.ai/role": "prefill"}),  # filtered out despite its empty queue
        endpoint(2, waiting=64),
        endpoint(3, waiting=32, labels={"llm-d.ai/role": "decode"}),
    ]
    req = request(prompt="p" * 400)
    first = scheduler.schedule(req, eps)
    assert ids(first.targets) == [3]  # 0.5 * (1 - 32/128) beats 0.5 * (1 - 64/128)
    scheduler.pre_request(req, first)
    # The prefix is now on .3 (1.0 + 0.375): it stays there even with a longer queue than .2 would suggest.
    busier = [eps[0], eps[1], endpoint(3, waiting=60, labels={"llm-d.ai/role": "decode"})]
    assert ids(scheduler.schedule(req, busier).targets) == [3]


def test_active_request_idle_preference() -> None:
    c = ctx()
    config = load_config(ACTIVE_REQUEST, c)
    scheduler = Scheduler(config, c)
    eps = [endpoint(1), endpoint(2), endpoint(3)]
    for _ in range(3):
        c.inflight.acquire(eps[0].key, 10, 0.0)
    for _ in range(5):
        c.inflight.acquire(eps[1].key, 10, 0.0)
    for _ in range(2):
        c.inflight.acquire(eps[2].key, 10, 0.0)  # within idleThreshold 2: idle
    assert ids(scheduler.schedule(request(), eps).targets) == [3]
    run = scheduler.schedule(request(), eps).runs[0]
    assert run.scores["active-request-scorer"] == {eps[0].key: 0.2, eps[1].key: 0.0, eps[2].key: 1.0}


def test_legacy_blend_spreads_cold_requests_by_lru() -> None:
    scheduler, _ = _scheduler(LEGACY_BLEND)
    eps = [endpoint(1), endpoint(2), endpoint(3)]
    chosen = []
    for i in range(3):  # three different cold prompts on an idle pool go to three different endpoints
        req = request(prompt=f"{i}" * 200)
        result = scheduler.schedule(req, eps)
        scheduler.pre_request(req, result)
        chosen.append(result.targets[0].key)
    assert sorted(chosen) == sorted(e.key for e in eps)


def test_session_affinity_then_token_load() -> None:
    c = ctx()
    scheduler = Scheduler(load_config(TOKEN_LOAD, c), c)
    eps = [endpoint(1), endpoint(2)]
    c.inflight.acquire(eps[1].key, 2000, 0.0)
    assert ids(scheduler.schedule(request(), eps).targets) == [1]
    token = "L3ZsbG0tMg=="  # base64("/vllm-2")
    named = [endpoint(1), dataclasses.replace(endpoint(2), name="vllm-2")]
    assert ids(scheduler.schedule(request(headers={"x-session-token": token}), named).targets) == [2]


def test_gie_detector_config_filters_and_detects() -> None:
    c = ctx()
    config = load_config(GIE_WITH_DETECTOR, c)
    detector = config.plugins["utilization-detector"]
    assert isinstance(detector, saturation.UtilizationDetector)
    assert isinstance(detector, Filter)
    assert config.saturation_detector == "utilization-detector"
    assert config.profiles["default"].filters == (detector,)
    now = c.clock()
    eps = [endpoint(1, waiting=0, kv=0.9, updated_at=now), endpoint(2, waiting=3, kv=0.5, updated_at=now)]
    # .1 has the better queue and KV total is 2*1 + 2*0.1 = 2.2 vs 2*0 + 2*0.5 = 1.0, but its KV is over 0.8.
    assert ids(Scheduler(config, c).schedule(request(), eps).targets) == [2]
    assert detector.saturation(eps) == pytest.approx((0.9 / 0.8 + max(3 / 5, 0.5 / 0.8)) / 2)


def test_conformance_header_filter() -> None:
    scheduler, _ = _scheduler(CONFORMANCE)
    eps = [endpoint(1), endpoint(2), endpoint(3)]
    req = request(headers={"test-epp-endpoint-selection": "192.168.1.3"})
    assert ids(scheduler.schedule(req, eps).targets) == [3]
    with pytest.raises(errors.ResourceExhausted, match="header-based-testing-filter"):
        scheduler.schedule(request(), eps)


def test_label_filters_from_config() -> None:
    scheduler, config = _scheduler(LABELS)
    eps = [
        endpoint(1, waiting=0, labels={"gpu": "a100", "llm-d.ai/role": "prefill"}),
        endpoint(2, waiting=5, labels={"gpu": "a100", "zone": "c"}),
        endpoint(3, waiting=3, labels={"gpu": "a100", "zone": "b"}),
        endpoint(4, waiting=1, labels={"gpu": "h100"}),
        endpoint(5, waiting=4, labels={"gpu": "a100"}),
    ]
    assert [f.type for f in config.profiles["default"].filters] == ["by-label-selector", "by-label"]
    result = scheduler.schedule(request(), eps)
    assert ids(result.targets) == [3]
    assert result.runs[0].filtered == {
        "gpu-a100": tuple(e.key for e in (eps[1], eps[2], eps[4])),
        "by-label": tuple(e.key for e in (eps[2], eps[4])),
    }


def test_every_new_filter_type_is_a_filter_in_a_default_profile() -> None:
    text = (
        HEAD
        + "plugins:\n"
        + "".join(
            f"- type: {t}\n"
            for t in ("decode-filter", "prefill-filter", "encode-filter", "label-selector-filter", "by-label")
        )
    )
    config = load_config(text, ctx())
    assert [f.type for f in config.profiles["default"].filters] == [
        "decode-filter", "prefill-filter", "encode-filter", "label-selector-filter", "by-label",
    ]  # fmt: skip
    assert config.profiles["default"].filters[0].filter(request(), [endpoint(1)], CycleState())
