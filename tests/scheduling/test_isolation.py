"""User plugins that raise, run over budget or break the contract: the request is routed, the drop is counted,
explained and logged once per transition; a filter is skipped, a picker replaced; hooks are guarded too."""

from __future__ import annotations

import dataclasses
import logging
import random

import pytest

from picker.control import accounting
from picker.endpoints.inflight import InflightTracker
from picker.endpoints.model import Endpoint
from picker.plugins import PluginContext, ProfileResult, ResponseInfo, ScoredEndpoint
from picker.scheduling.config import SchedulerConfig, load_config
from picker.scheduling.isolation import (
    BUDGET,
    DISABLED,
    ERROR,
    INVALID,
    Guard,
    Isolation,
    filter_values,
    pick_values,
    score_values,
)
from picker.scheduling.scheduler import Scheduler
from picker.telemetry import REGISTRY
from tests.conftest import FakeClock, endpoint, request
from tests.plugins import samples
from tests.scheduling.helpers import HEAD, ids

SAMPLES = "tests.plugins.samples"


def errors_total(plugin_type: str, name: str, reason: str) -> float:
    labels = {"plugin_type": plugin_type, "plugin_name": name, "reason": reason}
    return REGISTRY.get_sample_value("picker_plugin_errors_total", labels) or 0.0


def disabled_gauge(plugin_type: str, name: str) -> float | None:
    return REGISTRY.get_sample_value("picker_plugin_disabled", {"plugin_type": plugin_type, "plugin_name": name})


def with_queue(user: str, name: str, weight: float = 5.0, parameters: str = "", extra: str = "") -> str:
    """queue-scorer (weight 1) and one user scorer (``weight``) in one profile."""
    params = f"\n  parameters: {parameters}" if parameters else ""
    return (
        HEAD
        + f"""\
plugins:
- type: queue-scorer
- name: {name}
  type: "{SAMPLES}:{user}"{params}
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: queue-scorer
  - pluginRef: {name}
    weight: {weight}
{extra}"""
    )


def build(text: str) -> tuple[Scheduler, SchedulerConfig, FakeClock]:
    clock = FakeClock()
    ctx = PluginContext(clock=clock, inflight=InflightTracker(), rng=random.Random(3))
    config = load_config(text, ctx)
    return Scheduler(config, ctx), config, clock


# Endpoint 1 has the shortest queue; the user scorers below prefer another one, with a weight that wins.
EPS = [endpoint(1, waiting=0), endpoint(2, waiting=4), endpoint(3, waiting=8)]


# -- errors ------------------------------------------------------------------------------------------------


def test_a_raising_scorer_is_dropped_and_the_request_routed(caplog: pytest.LogCaptureFixture) -> None:
    scheduler, _, _ = build(with_queue("FlakyScorer", "flaky-a"))
    kind = f"{SAMPLES}:FlakyScorer"
    before = errors_total(kind, "flaky-a", ERROR)
    assert ids(scheduler.schedule(request(), EPS).targets) == [3]  # healthy: it decides

    with caplog.at_level(logging.INFO, logger="picker.scheduling.isolation"):
        for _ in range(3):
            result = scheduler.schedule(request(headers={"x-fail": "1"}), EPS)
            assert ids(result.targets) == [1]  # queue-scorer alone decides
        (profile,) = result.explain()["profiles"]
        assert profile["dropped"] == {"flaky-a": "error"}
        assert "flaky-a" not in profile["scores"]
        assert profile["weights"]["flaky-a"] == 5.0
        assert errors_total(kind, "flaky-a", ERROR) == before + 3
        failing = [r for r in caplog.records if r.levelno == logging.WARNING]
        assert len(failing) == 1  # once per transition, not per call
        assert "Scorer plugin 'flaky-a'" in failing[0].getMessage()
        assert "RuntimeError: flaky scorer failed on purpose" in failing[0].getMessage()
        assert failing[0].exc_info is not None  # with the traceback

        caplog.clear()
        assert ids(scheduler.schedule(request(), EPS).targets) == [3]
        assert [r.getMessage() for r in caplog.records] == [
            f"Scorer plugin 'flaky-a' ({kind}) recovered after 3 dropped calls"
        ]


@pytest.mark.parametrize(
    ("kind", "why"),
    [
        ("string", "score() returned str, not a mapping of endpoints or a sequence of scores"),
        ("short", "score() returned 2 scores for 3 endpoints"),
        ("none-values", "score() returned None (NoneType), not a number"),
        ("none", "score() returned NoneType"),
    ],
)
def test_an_invalid_score_result_is_dropped(kind: str, why: str, caplog: pytest.LogCaptureFixture) -> None:
    name = f"bad-{kind}"
    scheduler, _, _ = build(with_queue("BadResultScorer", name, parameters=f"{{kind: {kind}}}"))
    before = errors_total(f"{SAMPLES}:BadResultScorer", name, INVALID)
    with caplog.at_level(logging.WARNING, logger="picker.scheduling.isolation"):
        result = scheduler.schedule(request(), EPS)
    assert ids(result.targets) == [1]
    assert result.runs[0].dropped == {name: INVALID}
    assert errors_total(f"{SAMPLES}:BadResultScorer", name, INVALID) == before + 1
    assert why in caplog.text


def test_a_raising_filter_filters_nothing_that_cycle() -> None:
    text = HEAD + f"plugins:\n- {{name: odd-f, type: '{SAMPLES}:OddFilter'}}\n- type: queue-scorer\n"
    scheduler, _, _ = build(text)
    eps = [endpoint(1, waiting=5), endpoint(2, waiting=0), endpoint(3, waiting=9)]
    assert ids(scheduler.schedule(request(), eps).targets) == [1]  # endpoint 2 filtered out
    result = scheduler.schedule(request(headers={"x-fail": "1"}), eps)
    assert ids(result.targets) == [2]  # no filtering: the shortest queue wins
    assert result.runs[0].dropped == {"odd-f": ERROR}
    assert result.runs[0].candidates == tuple(e.key for e in eps)
    assert "odd-f" not in result.runs[0].filtered


def test_a_filter_returning_foreign_endpoints_is_invalid() -> None:
    scheduler, _, _ = build(HEAD + f"plugins:\n- {{name: foreign, type: '{SAMPLES}:ForeignFilter'}}\n")
    result = scheduler.schedule(request(), EPS)
    assert result.runs[0].dropped == {"foreign": INVALID}
    assert len(result.targets) == 1
    assert result.targets[0] in EPS


def test_a_user_scorer_can_ask_for_its_ties_to_be_taken_in_turn() -> None:
    scheduler, _, _ = build(HEAD + f"plugins:\n- {{name: even, type: '{SAMPLES}:EvenScorer'}}\n")
    eps = [endpoint(i) for i in range(1, 6)]
    flagged = [ids(scheduler.schedule(request(), eps).targets)[0] for _ in range(25)]
    assert all(sorted(flagged[i : i + 5]) == [1, 2, 3, 4, 5] for i in range(0, 25, 5))  # round robin
    drawn = [ids(scheduler.schedule(request(headers={"x-random": "1"}), eps).targets)[0] for _ in range(25)]
    assert any(sorted(drawn[i : i + 5]) != [1, 2, 3, 4, 5] for i in range(0, 25, 5))  # the default: at random


def test_a_raising_picker_is_replaced_by_max_score() -> None:
    text = HEAD + f"plugins:\n- {{name: low-p, type: '{SAMPLES}:LowestPicker'}}\n- type: queue-scorer\n"
    scheduler, config, _ = build(text)
    assert ids(scheduler.schedule(request(), EPS).targets) == [3]  # the lowest total
    config.plugins["low-p"].plugin.fail = True  # type: ignore[attr-defined]
    result = scheduler.schedule(request(), EPS)
    assert ids(result.targets) == [1]  # max-score's choice
    assert result.explain()["profiles"][0]["dropped"] == {"low-p": ERROR}
    assert errors_total(f"{SAMPLES}:LowestPicker", "low-p", ERROR) >= 1


# -- the time budget ---------------------------------------------------------------------------------------


def test_over_budget_is_dropped_then_disabled_for_a_cooldown() -> None:
    extra = "pluginIsolation: {budgetMs: 5, disableAfterOverruns: 3, cooldownMs: 1000}\n"
    scheduler, config, clock = build(with_queue("SlowScorer", "slow-a", parameters="{favourite: 2}", extra=extra))
    slow = config.plugins["slow-a"].plugin  # type: ignore[attr-defined]
    kind = f"{SAMPLES}:SlowScorer"
    before = errors_total(kind, "slow-a", BUDGET)

    def route() -> tuple[list[int], dict[str, str]]:
        result = scheduler.schedule(request(), EPS)
        return ids(result.targets), dict(result.runs[0].dropped)

    assert route() == ([1], {"slow-a": BUDGET})  # 10 ms > 5 ms: its preference for endpoint 3 is discarded
    assert route() == ([1], {"slow-a": BUDGET})
    assert disabled_gauge(kind, "slow-a") == 0
    assert route() == ([1], {"slow-a": BUDGET})  # the third in a row disables it
    assert disabled_gauge(kind, "slow-a") == 1
    assert errors_total(kind, "slow-a", BUDGET) == before + 3
    assert slow.calls == 3

    assert route() == ([1], {"slow-a": DISABLED})  # not called while cooling down
    assert slow.calls == 3
    assert errors_total(kind, "slow-a", BUDGET) == before + 3

    clock.advance(1.0)
    assert route() == ([1], {"slow-a": BUDGET})  # called again; on probation, one overrun disables it again
    assert (slow.calls, disabled_gauge(kind, "slow-a")) == (4, 1)

    clock.advance(1.0)
    slow.params = samples.SlowParams(cost_ms=1.0, favourite=2)
    assert route() == ([3], {})  # within budget: it counts again, and the gauge clears
    assert disabled_gauge(kind, "slow-a") == 0
    assert route() == ([3], {})


def test_budget_per_plugin_overrides_the_default_and_zero_never_disables() -> None:
    extra = "pluginIsolation: {disableAfterOverruns: 0}\n"
    text = with_queue("SlowScorer", "slow-b", parameters="{costMs: 20, favourite: 2}", extra=extra)
    text = text.replace("  parameters:", "  budgetMs: 25\n  parameters:", 1)
    scheduler, config, _ = build(text)
    assert ids(scheduler.schedule(request(), EPS).targets) == [3]  # 20 ms within its own 25 ms budget
    config.plugins["slow-b"].plugin.params = samples.SlowParams(cost_ms=30, favourite=2)  # type: ignore[attr-defined]
    for _ in range(10):
        assert scheduler.schedule(request(), EPS).runs[0].dropped == {"slow-b": BUDGET}
    assert config.plugins["slow-b"].plugin.calls == 11  # type: ignore[attr-defined]


# -- measured and explained like built-ins -----------------------------------------------------------------


def test_user_plugin_timings_reach_the_reference_duration_metric() -> None:
    scheduler, _, _ = build(with_queue("FlakyScorer", "timed-a"))
    result = scheduler.schedule(request(), EPS)
    kind = f"{SAMPLES}:FlakyScorer"
    assert ("Scorer", kind, "timed-a") in {t[:3] for t in result.plugin_timings}
    labels = {"extension_point": "Scorer", "plugin_type": kind, "plugin_name": "timed-a"}
    before = REGISTRY.get_sample_value("inference_extension_plugin_duration_seconds_count", labels) or 0.0
    accounting.plugin_timings(result.plugin_timings)  # what the ext_proc path does with every result
    assert REGISTRY.get_sample_value("inference_extension_plugin_duration_seconds_count", labels) == before + 1
    # A dropped call is timed too.
    failed = scheduler.schedule(request(headers={"x-fail": "1"}), EPS)
    assert ("Scorer", kind, "timed-a") in {t[:3] for t in failed.plugin_timings}


def test_every_reason_is_exported_from_the_start() -> None:
    build(with_queue("FlakyScorer", "fresh-a"))
    for reason in (ERROR, INVALID, BUDGET):
        assert (
            REGISTRY.get_sample_value(
                "picker_plugin_errors_total",
                {"plugin_type": f"{SAMPLES}:FlakyScorer", "plugin_name": "fresh-a", "reason": reason},
            )
            == 0.0
        )


# -- hooks -------------------------------------------------------------------------------------------------


def test_user_hooks_are_called_and_their_failures_contained(caplog: pytest.LogCaptureFixture) -> None:
    scheduler, config, _ = build(HEAD + f"plugins:\n- {{name: hooked, type: '{SAMPLES}:HookedScorer'}}\n")
    hooked = config.plugins["hooked"].plugin  # type: ignore[attr-defined]
    kind = f"{SAMPLES}:HookedScorer"
    req = request()
    result = scheduler.schedule(req, EPS)
    timings = scheduler.pre_request(req, result)
    assert hooked.pre == [result.targets[0].key]
    assert ("PreRequest", kind, "hooked") in {t[:3] for t in timings}
    scheduler.post_response(req, ResponseInfo(endpoint_key=EPS[0].key))
    assert hooked.post == [EPS[0].key]
    scheduler.endpoints_changed(frozenset({EPS[0].key}))
    assert hooked.pools == [frozenset({EPS[0].key})]

    hooked.fail = True
    before = errors_total(kind, "hooked", ERROR)
    with caplog.at_level(logging.WARNING, logger="picker.scheduling.isolation"):
        for _ in range(2):
            scheduler.pre_request(req, result)
            scheduler.post_response(req, ResponseInfo(endpoint_key=EPS[0].key))
    assert errors_total(kind, "hooked", ERROR) == before + 4
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 2  # one per hook, not per call
    assert any(m.startswith("PreRequest plugin 'hooked'") for m in messages)
    assert any(m.startswith("ResponseComplete plugin 'hooked'") for m in messages)


# -- the contract checks -----------------------------------------------------------------------------------


def test_score_values() -> None:
    eps = EPS
    assert score_values({eps[1]: 0.5}, eps) == [0.0, 0.5, 0.0]
    assert score_values((1, True, 0.25), eps) == [1.0, 1.0, 0.25]
    assert score_values(iter([0.1, 0.2, 0.3]), eps) == [0.1, 0.2, 0.3]
    assert score_values(b"abc", eps) == "score() returned bytes, not a mapping of endpoints or a sequence of scores"
    assert score_values([0.1, "0.2", 0.3], eps) == "score() returned '0.2' (str), not a number"


def test_filter_and_pick_values_return_the_callers_endpoints() -> None:
    altered = dataclasses.replace(EPS[1], labels={"x": "y"})  # same key, different view
    kept = filter_values([altered, EPS[0]], EPS)
    assert kept == (EPS[1], EPS[0])
    assert kept[0].labels == EPS[1].labels
    assert filter_values([EPS[0], EPS[0]], EPS) == f"filter() returned {EPS[0].key} twice"
    scored = [ScoredEndpoint(e, 0.0) for e in EPS]
    assert pick_values(ProfileResult(()), scored) == "pick() chose no endpoint"
    assert pick_values([EPS[0]], scored) == "pick() returned list, not a ProfileResult"
    foreign = Endpoint.create("10.0.0.1", 1)
    assert pick_values(ProfileResult((foreign,)), scored) == (
        f"pick() returned {foreign!r}, which is not one of the endpoints it was given"
    )


def test_guard_passes_results_through_and_lets_base_exceptions_out() -> None:
    clock = FakeClock()
    guard = Guard("t", "g", "Scorer", Isolation(), clock)

    def exit_now() -> None:
        raise KeyboardInterrupt

    assert guard.call(lambda x: x + 1, 1) == 2
    with pytest.raises(KeyboardInterrupt):
        guard.call(exit_now)
