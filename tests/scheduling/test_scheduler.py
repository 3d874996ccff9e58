"""Scheduler: the reference integration behaviours that are pure scheduling, explanation, timings, hooks."""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from typing import ClassVar

import orjson
import pytest

from picker import errors
from picker.bench.policies import REFERENCE_CONFIG_TEXT
from picker.endpoints.model import Endpoint, EndpointSnapshot
from picker.request.model import InferenceRequest
from picker.request.subset import filter_candidates, parse_subset
from picker.scheduling.config import SchedulerConfig, load_config
from picker.scheduling.framework import (
    Category,
    CycleState,
    ProfileResult,
    ResponseInfo,
    SchedulingResult,
)
from picker.scheduling.plugins import max_score, single_profile
from picker.scheduling.profile import Profile, WeightedScorer
from picker.scheduling.scheduler import Scheduler
from tests.conftest import endpoint, request
from tests.scheduling.helpers import HEAD, INTEGRATION, ctx, ids

ADAPTER = "sql-lora-1fdg2"


def _integration() -> Scheduler:
    c = ctx()
    return Scheduler(load_config(INTEGRATION, c), c)


# These tests pin the reference default's behaviour (queue 2, KV cache 2, prefix 3), which is no longer
# picker's built-in default (docs/scheduling.md), so they load it explicitly.
def _reference() -> Scheduler:
    c = ctx()
    return Scheduler(load_config(REFERENCE_CONFIG_TEXT, c), c)


# -- reference integration cases 1-4 and 9 (protocol.md §14) ------------------------------------------------


def test_case_1_queue_and_kv() -> None:
    eps = [endpoint(1, waiting=3, kv=0.2), endpoint(2, waiting=0, kv=0.1), endpoint(3, waiting=10, kv=0.2)]
    result = _integration().schedule(request(model="my-model", target_model="my-model-12345"), eps)
    assert ids(result.targets) == [2]


def test_case_2_active_adapter_low_queue() -> None:
    eps = [
        endpoint(1, waiting=0, kv=0.2, loras=("foo", "bar")),
        endpoint(2, waiting=0, kv=0.1, loras=("foo", ADAPTER)),
        endpoint(3, waiting=10, kv=0.2, loras=("foo", "bar")),
    ]
    result = _integration().schedule(request(model=ADAPTER), eps)
    assert ids(result.targets) == [2]
    assert result.runs[0].scores["lora-affinity-scorer"] == {eps[0].key: 0.0, eps[1].key: 1.0, eps[2].key: 0.0}


def test_case_3_affinity_beats_kv() -> None:
    eps = [
        endpoint(1, waiting=10, kv=0.2, loras=("foo", "bar")),
        endpoint(2, waiting=10, kv=0.4, loras=("foo", ADAPTER)),
        endpoint(3, waiting=10, kv=0.3, loras=("foo", "bar")),
    ]
    assert ids(_integration().schedule(request(model=ADAPTER), eps).targets) == [2]
    # Without the LoRA scorer the lowest KV wins: the adapter is what decides.
    c = ctx()
    no_lora = Scheduler(load_config(INTEGRATION.replace("  - pluginRef: lora-affinity-scorer\n", ""), c), c)
    assert ids(no_lora.schedule(request(model=ADAPTER), eps).targets) == [1]


def test_case_4_no_shedding_by_default_just_scores() -> None:
    eps = [endpoint(1, waiting=6, kv=0.2), endpoint(2, waiting=0, kv=0.85), endpoint(3, waiting=10, kv=0.9)]
    assert ids(_integration().schedule(request(model="sql-lora-sheddable"), eps).targets) == [1]


@pytest.mark.parametrize(
    ("hint", "expected"), [(["192.168.1.1", "192.168.1.2", "192.168.1.3"], 2), (["192.168.1.3"], 3)]
)
def test_case_9_subset(hint: list[str], expected: int) -> None:
    pool = [endpoint(1, waiting=3, kv=0.2), endpoint(2, waiting=0, kv=0.1), endpoint(3, waiting=10, kv=0.2)]
    candidates = filter_candidates(pool, parse_subset(hint))
    assert ids(_integration().schedule(request(), candidates).targets) == [expected]


def test_case_9_subset_matching_nothing_is_503() -> None:
    pool = [endpoint(1), endpoint(2)]
    with pytest.raises(errors.ServiceUnavailable) as info:
        _integration().schedule(request(), filter_candidates(pool, parse_subset(["192.168.1.99:8000"])))
    assert info.value.message == "failed to find endpoint candidates for serving the request"


# -- result, explanation, timings ---------------------------------------------------------------------------


def test_explain_has_every_scorer_score_per_endpoint() -> None:
    eps = [endpoint(1, waiting=3, kv=0.2), endpoint(2, waiting=0, kv=0.1), endpoint(3, waiting=10, kv=0.2)]
    result = _integration().schedule(request(), eps)
    explained = result.explain()
    orjson.dumps(explained)  # JSON-able
    (profile,) = explained["profiles"]
    assert profile["name"] == "default"
    assert profile["candidates"] == [e.key for e in eps]
    assert set(profile["scores"]) == {
        "queue-scorer",
        "kv-cache-utilization-scorer",
        "prefix-cache-scorer",
        "lora-affinity-scorer",
    }
    for per_endpoint in profile["scores"].values():
        assert set(per_endpoint) == {e.key for e in eps}
    assert profile["scores"]["queue-scorer"] == {eps[0].key: 0.7, eps[1].key: 1.0, eps[2].key: 0.0}
    assert profile["totals"][eps[1].key] == pytest.approx(1.0 + 0.9)
    assert profile["picked"] == [eps[1].key]
    assert explained["targets"] == [eps[1].key]


def test_weights_multiply_clamped_scores() -> None:
    eps = [endpoint(1, waiting=0, kv=0.5), endpoint(2, waiting=4, kv=0.0)]
    result = _reference().schedule(request(prompt="hi"), eps)
    totals = result.runs[0].totals
    assert totals[eps[0].key] == pytest.approx(2 * 1.0 + 2 * 0.5 + 3 * 0.0)
    assert totals[eps[1].key] == pytest.approx(2 * 0.0 + 2 * 1.0)
    assert ids(result.targets) == [1]


def test_plugin_timings_cover_every_plugin() -> None:
    result = _integration().schedule(request(), [endpoint(1), endpoint(2)])
    points = [(t.extension_point, t.plugin_type, t.plugin_name) for t in result.plugin_timings]
    assert points == [
        ("ProfilePicker", "single-profile-handler", "single-profile-handler"),
        ("Scorer", "queue-scorer", "queue-scorer"),
        ("Scorer", "kv-cache-utilization-scorer", "kv-cache-utilization-scorer"),
        ("Scorer", "prefix-cache-scorer", "prefix-cache-scorer"),
        ("Scorer", "lora-affinity-scorer", "lora-affinity-scorer"),
        ("Picker", "max-score-picker", "max-score-picker"),
        ("ProfilePicker", "single-profile-handler", "single-profile-handler"),
        ("ProcessProfilesResults", "single-profile-handler", "single-profile-handler"),
    ]
    assert all(t.seconds >= 0 for t in result.plugin_timings)
    assert result.duration_s >= sum(t.seconds for t in result.plugin_timings) * 0.5


def test_debug_log_line_carries_the_explanation(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG, logger="picker.scheduling.scheduler"):
        _integration().schedule(request(), [endpoint(1), endpoint(2)])
    (line,) = [r.getMessage() for r in caplog.records if r.name == "picker.scheduling.scheduler"]
    assert "test-request-id" in line
    assert "queue-scorer" in line
    assert "192.168.1.1:8000" in line


def test_fallbacks_follow_the_primary() -> None:
    c = ctx()
    text = INTEGRATION.replace(
        "- type: lora-affinity-scorer\n",
        "- type: lora-affinity-scorer\n- type: max-score-picker\n  parameters: {maxNumOfEndpoints: 3}\n",
    )
    scheduler = Scheduler(load_config(text, c), c)
    eps = [endpoint(1, waiting=5), endpoint(2, waiting=0), endpoint(3, waiting=10)]
    assert ids(scheduler.schedule(request(), eps).targets) == [2, 1, 3]


# -- hooks --------------------------------------------------------------------------------------------------


def test_prefix_learning_makes_the_same_prompt_sticky() -> None:
    scheduler = _reference()
    eps = [endpoint(i) for i in range(1, 9)]  # identical loads: only the prefix can decide
    req = request(prompt="You are a careful assistant. " * 20)
    first = scheduler.schedule(req, eps)
    scheduler.pre_request(req, first)
    for _ in range(20):
        again = scheduler.schedule(req, eps)
        assert again.targets == first.targets
        assert again.runs[0].scores["prefix-cache-scorer"][first.targets[0].key] == 1.0


def test_pre_request_returns_timings() -> None:
    scheduler = _reference()
    req = request(prompt="x" * 200)
    result = scheduler.schedule(req, [endpoint(1)])
    timings = scheduler.pre_request(req, result)
    assert [(t.extension_point, t.plugin_type) for t in timings] == [("PreRequest", "prefix-cache-scorer")]


def test_on_snapshot_purges_departed_endpoints_only_on_membership_change() -> None:
    scheduler = _reference()
    prefix = scheduler.config.plugins["prefix-cache-scorer"]
    req = request(prompt="x" * 200)
    one, two = endpoint(1), endpoint(2)
    scheduler.on_snapshot(EndpointSnapshot((one, two)))
    scheduler.pre_request(req, scheduler.schedule(req, [one]))
    assert prefix.index.endpoint_blocks(one.key) > 0
    scheduler.on_snapshot(EndpointSnapshot((endpoint(1, waiting=4), two)))  # metrics only: kept
    assert prefix.index.endpoint_blocks(one.key) > 0
    scheduler.on_snapshot(EndpointSnapshot((two,)))
    assert prefix.index.endpoint_blocks(one.key) == 0


# -- custom plugins through the framework -------------------------------------------------------------------


class WildScorer:
    """Returns a plain dict with out-of-range, NaN and missing scores."""

    type: ClassVar[str] = "wild"
    category: ClassVar[Category] = Category.BALANCE

    def __init__(self, name: str = "wild") -> None:
        self.name = name

    def score(
        self, req: InferenceRequest, endpoints: Sequence[Endpoint], cycle: CycleState
    ) -> Mapping[Endpoint, float]:
        values = [5.0, -1.0, math.nan]
        return {e: v for e, v in zip(endpoints, values, strict=False)}


class DropAll:
    type: ClassVar[str] = "drop-all"

    def __init__(self) -> None:
        self.name = "dropper"

    def filter(self, req: InferenceRequest, endpoints: Sequence[Endpoint], cycle: CycleState) -> Sequence[Endpoint]:
        return ()


class KeepOdd:
    type: ClassVar[str] = "keep-odd"

    def __init__(self) -> None:
        self.name = "odd"

    def filter(self, req: InferenceRequest, endpoints: Sequence[Endpoint], cycle: CycleState) -> Sequence[Endpoint]:
        return [e for e in endpoints if e.port % 2 == 1]


class Recorder:
    type: ClassVar[str] = "recorder"

    def __init__(self, fail: bool = False) -> None:
        self.name = "rec"
        self.fail = fail
        self.seen: list[tuple[str, object]] = []

    def pre_request(self, req: InferenceRequest, result: SchedulingResult) -> None:
        self.seen.append(("pre", result.targets))
        if self.fail:
            raise RuntimeError("boom")

    def first_token(self, req: InferenceRequest, info: ResponseInfo) -> None:
        self.seen.append(("first", info.ttft_s))
        if self.fail:
            raise RuntimeError("boom")

    def post_response(self, req: InferenceRequest, info: ResponseInfo) -> None:
        self.seen.append(("post", info.endpoint_key))
        if self.fail:
            raise RuntimeError("boom")


def _hand_built(
    *, filters: Sequence[object] = (), scorers: Sequence[object] = (), extra: Sequence[object] = (), count: int = 1
) -> Scheduler:
    c = ctx()
    picker = max_score.create("picker", max_score.Params(max_num_of_endpoints=count), c)
    profile = Profile(
        "p",
        filters,  # type: ignore[arg-type]
        [WeightedScorer(s, 1.0) for s in scorers],  # type: ignore[arg-type]
        picker,
    )
    handler = single_profile.SingleProfileHandler("h")
    plugins = {p.name: p for p in (*filters, *scorers, *extra)}
    return Scheduler(SchedulerConfig(profiles={"p": profile}, profile_handler=handler, plugins=plugins), c)


def test_scores_are_clamped_and_missing_ones_are_zero() -> None:
    eps = [endpoint(i) for i in range(1, 5)]
    result = _hand_built(scorers=[WildScorer()]).schedule(request(), eps)
    assert result.runs[0].scores["wild"] == {eps[0].key: 1.0, eps[1].key: 0.0, eps[2].key: 0.0, eps[3].key: 0.0}
    assert ids(result.targets) == [1]


def test_filter_leaving_nothing_is_resource_exhausted() -> None:
    with pytest.raises(errors.ResourceExhausted) as info:
        _hand_built(filters=[DropAll()]).schedule(request(), [endpoint(1)])
    assert info.value.message.startswith("failed to find target endpoint: ")
    assert "'dropper'" in info.value.message
    assert "drop-all" in info.value.message
    assert info.value.status == 429


def test_filters_narrow_and_are_recorded() -> None:
    eps = [endpoint(1, port=8001), endpoint(2, port=8000), endpoint(3, port=8003)]
    result = _hand_built(filters=[KeepOdd()], count=5).schedule(request(), eps)
    assert sorted(ids(result.targets)) == [1, 3]
    assert result.runs[0].filtered == {"odd": (eps[0].key, eps[2].key)}
    assert ("Filter", "keep-odd", "odd") in [(t[0], t[1], t[2]) for t in result.plugin_timings]


def test_hooks_fan_out_and_failures_are_contained(caplog: pytest.LogCaptureFixture) -> None:
    good, bad = Recorder(), Recorder(fail=True)
    bad.name = "bad"
    scheduler = _hand_built(extra=[good, bad])
    req = request()
    result = scheduler.schedule(req, [endpoint(1)])
    with caplog.at_level(logging.ERROR):
        pre = scheduler.pre_request(req, result)
        first = scheduler.first_token(req, ResponseInfo(endpoint_key="192.168.1.1:8000", ttft_s=0.2))
        post = scheduler.post_response(req, ResponseInfo(endpoint_key="192.168.1.1:8000", status=200))
    assert good.seen == [("pre", result.targets), ("first", 0.2), ("post", "192.168.1.1:8000")]
    assert len(bad.seen) == 3
    points = [t.extension_point for t in (*pre, *first, *post)]
    assert points == ["PreRequest"] * 2 + ["FirstToken"] * 2 + ["ResponseComplete"] * 2
    assert sum("boom" in (r.exc_text or "") or "failed" in r.getMessage() for r in caplog.records) == 3


def test_empty_candidates_are_service_unavailable() -> None:
    with pytest.raises(errors.ServiceUnavailable):
        _integration().schedule(request(), [])


def test_handler_naming_an_unknown_profile_is_internal() -> None:
    class Confused(single_profile.SingleProfileHandler):
        def pick_profiles(
            self,
            req: InferenceRequest,
            profiles: Mapping[str, object],
            results: Mapping[str, ProfileResult | None],
            cycle: CycleState,
        ) -> Sequence[str]:
            return () if results else ("ghost",)

    c = ctx()
    base = load_config(INTEGRATION, c)
    config = SchedulerConfig(profiles=base.profiles, profile_handler=Confused("h"), plugins=base.plugins)
    with pytest.raises(errors.Internal, match="ghost"):
        Scheduler(config, c).schedule(request(), [endpoint(1)])


def test_custom_config_with_weighted_random_picker_spreads_load() -> None:
    c = ctx(seed=1)
    text = HEAD + "plugins:\n- type: queue-scorer\n- type: weighted-random-picker\n"
    scheduler = Scheduler(load_config(text, c), c)
    eps = [endpoint(1, waiting=0), endpoint(2, waiting=5), endpoint(3, waiting=10)]
    picks = [ids(scheduler.schedule(request(), eps).targets)[0] for _ in range(300)]
    assert picks.count(3) == 0  # score 0
    assert picks.count(1) > picks.count(2) > 0
