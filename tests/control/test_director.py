"""The director: candidates → rewrite → resolver → admission → scheduler → lease; completion and expiry."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Sequence

import pytest

from picker import errors
from picker.bench.policies import REFERENCE_CONFIG_TEXT
from picker.control.director import (
    DEFAULT_OUTPUT_TOKENS,
    DEFAULT_TPOT_S,
    HOLD_OVERHEAD_S,
    MAX_EXPECTED_OUTPUT_TOKENS,
    Director,
    expected_output_tokens,
    expected_tokens,
)
from picker.endpoints.inflight import InflightTracker
from picker.endpoints.model import Endpoint
from picker.endpoints.store import EndpointStore
from picker.request.model import InferenceRequest, Subset
from picker.request.parse import parse_request
from picker.scheduling.config import load_config
from picker.scheduling.framework import PluginContext, PluginTiming, ResponseInfo, SchedulingResult
from picker.scheduling.scheduler import Scheduler
from picker.settings import ServerSettings
from picker.telemetry import REGISTRY
from tests.conftest import FakeClock, endpoint, request

P1, P2, P3 = "192.168.1.1:8000", "192.168.1.2:8000", "192.168.1.3:8000"
BODY = b'{"model":"my-model","prompt":"hello there","max_tokens":40}'


class Recording(Scheduler):
    def __init__(self, *args: object) -> None:
        super().__init__(*args)  # type: ignore[arg-type]
        self.pre: list[SchedulingResult] = []
        self.first: list[ResponseInfo] = []
        self.post: list[ResponseInfo] = []

    def pre_request(self, req: InferenceRequest, result: SchedulingResult) -> tuple[PluginTiming, ...]:
        self.pre.append(result)
        return super().pre_request(req, result)

    def first_token(self, req: InferenceRequest, info: ResponseInfo) -> tuple[PluginTiming, ...]:
        self.first.append(info)
        return super().first_token(req, info)

    def post_response(self, req: InferenceRequest, info: ResponseInfo) -> tuple[PluginTiming, ...]:
        self.post.append(info)
        return super().post_response(req, info)


def make(
    eps: Sequence[Endpoint] = (), *, settings: ServerSettings | None = None, **kw: object
) -> tuple[Director, Recording, InflightTracker, FakeClock]:
    clock = FakeClock()
    store = EndpointStore()
    store.set_endpoints(
        list(eps) or [endpoint(1, waiting=3, kv=0.2), endpoint(2, kv=0.1), endpoint(3, waiting=10, kv=0.2)]
    )
    inflight = InflightTracker()
    ctx = PluginContext(clock=clock, inflight=inflight)
    # The reference default: these tests expect its queue / KV scoring (endpoint 2 has the shortest queue).
    scheduler = Recording(load_config(REFERENCE_CONFIG_TEXT, ctx), ctx)
    director = Director(
        store=store,
        scheduler=scheduler,
        inflight=inflight,
        clock=clock,
        settings=settings or ServerSettings(),
        **kw,  # type: ignore[arg-type]
    )
    return director, scheduler, inflight, clock


def parsed(headers: dict[str, str] | None = None, body: bytes = BODY, subset: Subset | None = None) -> InferenceRequest:
    return parse_request({":path": "/v1/completions", **(headers or {})}, body, subset=subset)


async def test_route_picks_schedules_leases_and_runs_pre_request() -> None:
    director, scheduler, inflight, clock = make()
    routed = await director.route(parsed())
    assert routed.destination == P2
    assert routed.lease is not None
    assert routed.lease.tokens == expected_tokens(routed.req) == routed.req.prompt_tokens + 40
    assert inflight.requests(P2) == 1
    assert scheduler.pre == [routed.result]
    assert routed.routed_at == clock()


async def test_no_candidates_is_503() -> None:
    director, *_ = make([endpoint(1)])
    with pytest.raises(errors.ServiceUnavailable, match="failed to find endpoint candidates"):
        await director.route(parsed(subset=Subset(hostports=frozenset({"10.0.0.1:80"}))))


async def test_subset_filter_applies_unless_disabled() -> None:
    director, *_ = make()
    only3 = Subset(hostports=frozenset({P3}))
    assert (await director.route(parsed(subset=only3))).destination == P3
    off, *_ = make(settings=ServerSettings(disable_subset_filter=True))
    assert (await off.route(parsed(subset=only3))).destination == P2


async def test_rewrite_header_sets_the_target_model_and_body() -> None:
    director, *_ = make()
    routed = await director.route(parsed({"x-gateway-model-name-rewrite": "big"}))
    assert (routed.req.model, routed.req.target_model) == ("my-model", "big")
    assert b'"model":"big"' in routed.req.body


async def test_resolver_and_admitter_seams() -> None:
    seen: list[str] = []

    def resolver(req: InferenceRequest) -> InferenceRequest:
        seen.append(req.target_model)
        return dataclasses.replace(req, priority=7)

    class Deny:
        async def admit(self, req: InferenceRequest, candidates: Sequence[Endpoint]) -> None:
            assert req.priority == 7
            assert len(candidates) == 3
            raise errors.ResourceExhausted("system saturated, sheddable request dropped")

    director, _, inflight, _ = make(resolver=resolver, admitter=Deny())
    with pytest.raises(errors.ResourceExhausted):
        await director.route(parsed({"x-gateway-model-name-rewrite": "big"}))
    assert seen == ["big"]  # the header rewrite happens first; the resolver sees it
    assert inflight.requests(P2) == 0  # rejected before any lease


async def test_header_only_route_without_pods_is_500_and_with_excluded_pods_still_routes() -> None:
    empty, *_ = make()
    empty.store.set_endpoints([])
    with pytest.raises(errors.Internal, match="no pods available in datastore"):
        await empty.route_without_body(parsed(body=b""))
    director, *_ = make([endpoint(1, excluded=True)])
    assert (await director.route_without_body(parsed(body=b""))).destination == P1


async def test_complete_releases_observes_and_is_idempotent() -> None:
    director, scheduler, inflight, clock = make()
    routed = await director.route(parsed())
    clock.advance(0.2)
    director.first_byte(routed)
    clock.advance(1.0)
    director.complete(routed, status=200, prompt_tokens=3, completion_tokens=11, served_key=P2)
    director.complete(routed, status=200)
    assert inflight.requests(P2) == 0
    load = inflight.load(P2)
    assert load.ttft_s == pytest.approx(0.2)
    assert load.tpot_s == pytest.approx(0.1)
    assert len(scheduler.post) == 1
    info = scheduler.post[0]
    assert (info.endpoint_key, info.completion_tokens, info.ttft_s) == (P2, 11, pytest.approx(0.2))


async def test_hold_and_expire_after_the_expected_duration() -> None:
    director, scheduler, inflight, clock = make(settings=ServerSettings(inflight_timeout_s=300.0))
    routed = await director.route(parsed())
    director.hold(routed)
    assert director.held == 1
    # Never observed on P2: the allowance plus the expected output at the default TPOT.
    hold_s = HOLD_OVERHEAD_S + expected_output_tokens(routed.req) * DEFAULT_TPOT_S
    assert hold_s < 300.0
    assert director.expire(clock() + hold_s - 0.1) == 0
    before = REGISTRY.get_sample_value("picker_inflight_expired_total") or 0.0
    assert director.expire(clock() + hold_s) == 1
    assert REGISTRY.get_sample_value("picker_inflight_expired_total") == before + 1
    assert inflight.requests(P2) == 0
    assert director.held == 0
    assert scheduler.post[-1].endpoint_key == P2


async def test_hold_uses_the_observed_tpot_and_is_capped_by_the_timeout() -> None:
    director, _, inflight, clock = make(settings=ServerSettings(inflight_timeout_s=10.0))
    inflight.observe(P2, tpot_s=0.001)  # a fast endpoint: its requests end sooner
    fast = await director.route(parsed())
    director.hold(fast)
    fast_s = HOLD_OVERHEAD_S + expected_output_tokens(fast.req) * 0.001
    assert director.expire(clock() + fast_s - 0.01) == 0
    assert director.expire(clock() + fast_s) == 1
    inflight.observe(P2, tpot_s=10.0)  # so slow that only the timeout ends the hold (EWMA moves towards 10 s)
    slow = await director.route(parsed())
    director.hold(slow)
    assert director.expire(clock() + 9.9) == 0
    assert director.expire(clock() + 10.0) == 1


async def test_abandon_releases_at_once() -> None:
    director, _, inflight, _ = make()
    routed = await director.route(parsed())
    director.abandon(routed)
    director.hold(routed)  # a finished request is never held
    assert inflight.requests(P2) == 0
    assert director.held == 0


def test_expected_tokens() -> None:
    assert expected_tokens(request(prompt="x" * 40, max_tokens=None)) == 10 + DEFAULT_OUTPUT_TOKENS
    assert expected_tokens(request(prompt="x" * 40, max_tokens=10**9)) == 10 + MAX_EXPECTED_OUTPUT_TOKENS
    assert expected_tokens(request(prompt="x" * 40, max_tokens=5)) == 15


def test_record_error_counts_by_code() -> None:
    director, *_ = make()
    labels = {"model_name": "my-model", "target_model_name": "my-model", "error_code": "BadRequest"}
    before = REGISTRY.get_sample_value("inference_objective_request_error_total", labels) or 0.0
    director.record_error(errors.BadRequest("x"), request())
    assert REGISTRY.get_sample_value("inference_objective_request_error_total", labels) == before + 1


# -- in-flight and response accounting (TTFT/TPOT from streamed responses; admission feedback) ----------------


class Recorder:
    """An admitter that admits everything, can hold requests, and counts lease releases."""

    def __init__(self) -> None:
        self.releases = 0
        self.gate: asyncio.Event | None = None

    async def admit(self, req: InferenceRequest, candidates: Sequence[Endpoint]) -> None:
        if self.gate is not None:
            await self.gate.wait()

    def released(self) -> None:
        self.releases += 1


async def test_non_streamed_responses_observe_no_ttft_or_tpot() -> None:
    director, scheduler, inflight, clock = make()
    routed = await director.route(parsed())
    clock.advance(2.0)
    director.first_byte(routed, token=False)  # a JSON body arrives whole, at the end
    assert routed.first_byte_at == clock()
    assert routed.first_token_at is None
    assert inflight.load(P2).tokens == 40  # the prompt is no longer pending work
    director.complete(routed, status=200, completion_tokens=40)
    load = inflight.load(P2)
    assert (load.ttft_s, load.tpot_s) == (None, None)
    assert scheduler.first == []  # no first token: the whole body is the response
    assert scheduler.post[-1].ttft_s is None


async def test_the_first_token_goes_to_first_token_plugins_once_and_stream_events_give_the_tpot() -> None:
    director, scheduler, inflight, clock = make()
    routed = await director.route(parsed())
    clock.advance(0.3)
    director.first_byte(routed, token=True)
    clock.advance(0.2)
    director.first_byte(routed, token=True)  # later chunks are not first
    assert [(i.endpoint_key, i.ttft_s) for i in scheduler.first] == [(P2, pytest.approx(0.3))]
    assert scheduler.post == []
    clock.advance(0.7)
    director.complete(routed, status=200, stream_events=10)  # the usage has no token counts
    assert len(scheduler.first) == 1
    assert scheduler.post[-1].ttft_s == pytest.approx(0.3)
    load = inflight.load(P2)
    assert load.ttft_s == pytest.approx(0.3)
    assert load.tpot_s == pytest.approx(0.1)


async def test_usage_tokens_beat_the_event_count_and_one_token_gives_no_tpot() -> None:
    director, _, inflight, clock = make()
    routed = await director.route(parsed())
    director.first_byte(routed)
    clock.advance(1.0)
    director.complete(routed, completion_tokens=5, stream_events=100)
    assert inflight.load(P2).tpot_s == pytest.approx(0.25)
    single = await director.route(parsed())
    director.first_byte(single)
    clock.advance(1.0)
    director.complete(single, completion_tokens=1)
    assert inflight.load(P2).tpot_s == pytest.approx(0.25)  # unchanged


async def test_the_admitter_hears_every_release() -> None:
    recorder = Recorder()
    director, *_ = make(admitter=recorder, settings=ServerSettings(inflight_timeout_s=1.0))
    director.complete(await director.route(parsed()))
    director.abandon(await director.route(parsed()))
    held = await director.route(parsed())
    director.hold(held)
    director.expire(held.routed_at + 1.0)
    assert recorder.releases == 3
    director.complete(held)  # already released: not again
    assert recorder.releases == 3


async def test_a_request_that_waited_in_admission_is_scheduled_on_the_current_endpoints() -> None:
    recorder = Recorder()
    recorder.gate = asyncio.Event()
    director, *_ = make(admitter=recorder)
    task = asyncio.create_task(director.route(parsed()))
    for _ in range(5):
        await asyncio.sleep(0)
    director.store.set_endpoints([endpoint(3, kv=0.5)])  # .2 left the pool while the request waited
    recorder.gate.set()
    routed = await task
    assert routed.destination == P3


async def test_a_pool_that_emptied_during_admission_is_503() -> None:
    recorder = Recorder()
    recorder.gate = asyncio.Event()
    director, *_ = make(admitter=recorder)
    task = asyncio.create_task(director.route(parsed()))
    await asyncio.sleep(0)
    director.store.set_endpoints([])
    recorder.gate.set()
    with pytest.raises(errors.ServiceUnavailable, match="failed to find endpoint candidates"):
        await task


async def test_an_endpoint_answering_only_5xx_is_ejected_then_readmitted() -> None:
    director, _, inflight, clock = make()
    for _ in range(5):
        routed = await director.route(parsed())
        assert routed.destination == P2
        director.complete(routed, status=500)
    snap = director.store.current()
    ejected = snap.get(P2)
    assert ejected is not None
    assert ejected.ejected
    assert P2 not in {e.key for e in snap.candidates()}
    assert sample("picker_endpoint_ejections_total", {"endpoint": P2}) >= 1
    routed = await director.route(parsed())
    assert routed.destination != P2  # the next best
    director.complete(routed, status=200)
    assert inflight.open_leases == 0

    clock.advance(10.0)
    assert director.readmit_outliers() == [P2]
    assert (await director.route(parsed())).destination == P2


def sample(name: str, labels: dict[str, str]) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


async def _answered_once(director: Director, clock: FakeClock, seconds: float) -> None:
    """One watched request answered in ``seconds``: the pool has a reference time."""
    routed = await director.route(parsed())
    director.watch(routed)
    clock.advance(seconds)
    director.answered(routed, 200)
    director.complete(routed, status=200)


async def test_a_server_that_stops_answering_is_suspect_within_a_second_and_back_at_its_answer() -> None:
    director, _, _, clock = make()
    await _answered_once(director, clock, 0.2)
    hung = await director.route(parsed())
    assert hung.destination == P2
    director.watch(hung)
    clock.advance(0.3)
    assert director.check_hung() == []
    clock.advance(0.6)
    assert [(c.key, c.suspect) for c in director.check_hung()] == [(P2, True)]
    snap = director.store.current()
    assert P2 not in {e.key for e in snap.candidates()}
    assert sample("picker_endpoint_suspect", {"endpoint": P2}) == 1.0
    assert (await director.route(parsed())).destination != P2  # new requests go elsewhere

    director.answered(hung, 200)  # it answers again
    assert not director.store.current().get(P2).suspect  # type: ignore[union-attr]
    assert REGISTRY.get_sample_value("picker_endpoint_suspect", {"endpoint": P2}) is None
    assert (await director.route(parsed())).destination == P2


async def test_requests_not_watched_never_make_a_server_suspect() -> None:
    director, _, _, clock = make()
    await _answered_once(director, clock, 0.2)
    routed = await director.route(parsed())  # its gateway reports no response: not watched
    for _ in range(100):
        clock.advance(1.0)
        assert director.check_hung() == []
    director.hold(routed)
    assert not director.store.current().get(P2).suspect  # type: ignore[union-attr]


async def test_a_request_given_up_ends_its_wait() -> None:
    director, _, _, clock = make()
    await _answered_once(director, clock, 0.2)
    routed = await director.route(parsed())
    director.watch(routed)
    clock.advance(0.1)
    director.abandon(routed)  # the client went away
    clock.advance(5.0)
    assert director.check_hung() == []
    assert director.hung.pending() == 0


# -- metric series stay bounded: pods come and go, clients name any model --------------------------------------


async def test_the_series_of_pods_that_left_the_pool_are_dropped() -> None:
    director, _, _, _ = make()
    attempts = "inference_extension_scheduler_attempts_total"
    for generation in range(50):  # pods replaced one after another, each scheduled to a few times
        pod = endpoint(2, kv=0.1)
        pod = dataclasses.replace(pod, name=f"pod-{generation}")
        director.store.set_endpoints([endpoint(1, waiting=3), pod])
        for _ in range(3):
            director.complete(await director.route(parsed()), status=200)
        director.forget_departed()
    labels = {"status": "success", "target_model_name": "my-model", "namespace": "", "port": "8000"}
    assert sample(attempts, {**labels, "pod_name": "pod-49"}) == 3.0
    assert REGISTRY.get_sample_value(attempts, {**labels, "pod_name": "pod-48"}) is None
    pods = [s.labels["pod_name"] for metric in REGISTRY.collect() if metric.name == attempts.removesuffix("_total")
            for s in metric.samples if s.name == attempts and s.labels["pod_name"].startswith("pod-")]  # fmt: skip
    assert pods == ["pod-49"]  # the pod of the pool now, not all fifty


async def test_model_names_beyond_the_bound_share_one_series(monkeypatch: pytest.MonkeyPatch) -> None:
    from picker.control import accounting
    from picker.telemetry import labels

    monkeypatch.setattr(accounting, "_model", labels.BoundedValues(4))
    director, *_ = make()
    for i in range(20):  # a client naming a new model every time
        body = b'{"model":"m%d","prompt":"hello there","max_tokens":4}' % i
        director.complete(await director.route(parsed(body=body)), status=200)
    total = "inference_objective_request_total"
    assert sample(total, {"model_name": "m3", "target_model_name": "m3", "priority": "0"}) == 1.0
    other = labels.OTHER
    assert sample(total, {"model_name": other, "target_model_name": other, "priority": "0"}) == 16.0
    assert REGISTRY.get_sample_value(total, {"model_name": "m5", "target_model_name": "m5", "priority": "0"}) is None
