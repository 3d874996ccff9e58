"""FlowController: dispatch below the ceiling, waiting while saturated, TTL 503, capacity 429, client gone,
fairness between flows, and its metrics."""

from __future__ import annotations

import asyncio
import time

import pytest

from picker import errors
from picker.admission import FlowController
from picker.admission.flow import TTL_MESSAGE
from picker.admission.flowconfig import BandConfig, FlowConfig
from picker.endpoints.model import EndpointSnapshot
from picker.request.model import InferenceRequest
from picker.telemetry import REGISTRY
from tests.admission.helpers import Gate, req
from tests.conftest import FakeClock, endpoint

POOL = "flow-test-pool"
EPS = (endpoint(1), endpoint(2))


def controller(gate: Gate, config: FlowConfig | None = None, clock: object = None) -> FlowController:
    return FlowController(
        detector=gate, candidates=lambda: EPS, clock=clock or FakeClock(), config=config, pool_name=POOL
    )  # type: ignore[arg-type]


async def settle(rounds: int = 20) -> None:
    """Let every ready callback and task step run (bounded)."""
    for _ in range(rounds):
        await asyncio.sleep(0)


def outcomes(r: InferenceRequest, outcome: str) -> float:
    labels = {
        "fairness_id": r.fairness_id,
        "priority": str(r.priority),
        "outcome": outcome,
        "inference_pool": POOL,
        "model_name": r.model,
        "target_model_name": r.target_model,
    }
    return (
        REGISTRY.get_sample_value("inference_extension_flow_control_request_queue_duration_seconds_count", labels)
        or 0.0
    )


def queue_size(r: InferenceRequest) -> float:
    labels = {
        "fairness_id": r.fairness_id,
        "priority": str(r.priority),
        "inference_pool": POOL,
        "model_name": r.model,
        "target_model_name": r.target_model,
    }
    return REGISTRY.get_sample_value("inference_extension_flow_control_queue_size", labels) or 0.0


async def test_below_the_ceiling_requests_pass_at_once() -> None:
    gate = Gate(0.5)
    fc = controller(gate)
    r = req("fast-flow")
    before = outcomes(r, "Dispatched")
    await fc.admit(r, EPS)
    assert outcomes(r, "Dispatched") == before + 1
    assert (
        REGISTRY.get_sample_value("inference_extension_flow_control_pool_saturation", {"inference_pool": POOL}) == 0.5
    )


async def test_saturated_requests_wait_until_capacity_frees() -> None:
    gate = Gate(1.0)
    fc = controller(gate)
    r = req("wait-flow")
    task = asyncio.create_task(fc.admit(r, EPS))
    await settle()
    assert not task.done()
    assert len(fc.queue) == 1
    assert queue_size(r) == 1
    fc.released()  # still saturated: nothing moves
    await settle()
    assert not task.done()
    gate.value = 0.9
    fc.on_snapshot(EndpointSnapshot())  # new metrics arrive
    await settle()
    assert task.done()
    await task
    assert len(fc.queue) == 0
    assert queue_size(r) == 0


async def test_a_custom_ceiling() -> None:
    gate = Gate(0.8)
    fc = controller(gate, FlowConfig(ceiling=0.75))
    task = asyncio.create_task(fc.admit(req(), EPS))
    await settle()
    assert not task.done()
    gate.value = 0.7
    fc.released()
    await settle()
    await task


async def test_strict_priority_when_capacity_frees() -> None:
    gate = Gate(1.0)
    fc = controller(gate)
    order: list[int] = []

    async def client(priority: int) -> None:
        await fc.admit(req(priority=priority), EPS)
        order.append(priority)
        gate.value = 1.0  # each dispatched request takes the freed slot

    tasks = [asyncio.create_task(client(p)) for p in (-1, 0, 3, 0)]
    await settle()
    for _ in range(4):
        gate.value = 0.0
        fc.released()
        await settle()
    await asyncio.gather(*tasks)
    assert order == [3, 0, 0, -1]


async def test_ttl_expiry_is_503() -> None:
    clock = FakeClock()
    fc = controller(Gate(1.0), FlowConfig(default_ttl_s=5.0), clock)
    r = req("ttl-flow")
    before = outcomes(r, "EvictedTTL")
    task = asyncio.create_task(fc.admit(r, EPS))
    await settle()
    assert fc.expire() == []  # not yet
    clock.advance(5.0)
    assert [x.req for x in fc.expire()] == [r]
    with pytest.raises(errors.ServiceUnavailable) as info:
        await task
    assert info.value.status == 503
    assert info.value.message == TTL_MESSAGE
    assert info.value.message.startswith("request timed out in queue: ")
    assert outcomes(r, "EvictedTTL") == before + 1
    assert queue_size(r) == 0


async def test_ttl_timer_fires_on_the_loop() -> None:
    fc = controller(Gate(1.0), FlowConfig(bands={2: BandConfig(ttl_s=0.02)}), time.monotonic)
    with pytest.raises(errors.ServiceUnavailable, match="request timed out in queue"):
        await asyncio.wait_for(fc.admit(req(priority=2), EPS), timeout=5.0)
    assert len(fc.queue) == 0


async def test_capacity_rejects_with_429() -> None:
    fc = controller(Gate(1.0), FlowConfig(max_requests=1))
    r = req("cap-flow")
    before = outcomes(r, "RejectedCapacity")
    waiting = asyncio.create_task(fc.admit(req("cap-flow"), EPS))
    await settle()
    with pytest.raises(errors.ResourceExhausted) as info:
        await fc.admit(r, EPS)
    assert info.value.status == 429
    assert info.value.message == "request rejected pre-queue: queue at capacity and displacement failed to make space"
    assert outcomes(r, "RejectedCapacity") == before + 1
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting


async def test_a_client_that_goes_away_leaves_the_queue() -> None:
    fc = controller(Gate(1.0), FlowConfig(default_ttl_s=60.0))
    r = req("gone-flow")
    before = outcomes(r, "EvictedContextCancelled")
    task = asyncio.create_task(fc.admit(r, EPS))
    await settle()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert len(fc.queue) == 0
    assert outcomes(r, "EvictedContextCancelled") == before + 1
    assert queue_size(r) == 0


async def test_a_cancelled_waiter_is_skipped_by_dispatch() -> None:
    gate = Gate(1.0)
    fc = controller(gate)
    first = asyncio.create_task(fc.admit(req("skip"), EPS))
    second = asyncio.create_task(fc.admit(req("skip"), EPS))
    await settle()
    first.cancel()  # its waiter is cancelled now; the task sees it on its next step
    gate.value = 0.0
    assert fc.dispatch_one() is not None  # the second one, not the abandoned first
    await settle()
    await second
    with pytest.raises(asyncio.CancelledError):
        await first


@pytest.mark.parametrize(("fairness", "quiet_share"), [("round-robin-fairness-policy", 10), (None, 0)])
async def test_fairness_ids_share_capacity(fairness: str | None, quiet_share: int) -> None:
    """Two flows, one flooding: with round-robin the quiet one gets half the dispatches."""
    capacity = 2
    busy = capacity  # the pool starts full
    band = BandConfig(fairness=fairness) if fairness else BandConfig()
    fc = controller(Gate(), FlowConfig(default_band=band))
    fc.detector.saturation = lambda endpoints: busy / capacity  # type: ignore[method-assign]
    dispatched: list[str] = []

    async def client(flow: str) -> None:
        nonlocal busy
        await fc.admit(req(flow), EPS)
        busy += 1  # the dispatched request takes a slot
        dispatched.append(flow)

    tasks = [asyncio.create_task(client("flood")) for _ in range(30)]
    await settle()
    tasks += [asyncio.create_task(client("quiet")) for _ in range(10)]
    await settle()
    assert len(fc.queue) == 40
    for _ in range(20):  # twenty requests finish, one at a time
        busy -= 1
        fc.released()
        await settle()
    assert len(dispatched) == 20
    assert dispatched.count("quiet") == quiet_share
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    assert len(fc.queue) == 0


async def test_each_dispatch_is_counted_before_the_next_decision() -> None:
    """One dispatch per pass: a detector counting in-flight requests never overshoots the capacity."""
    capacity = 3
    inflight = capacity
    fc = controller(Gate())
    fc.detector.saturation = lambda endpoints: inflight / capacity  # type: ignore[method-assign]

    async def client() -> None:
        nonlocal inflight
        await fc.admit(req("burst"), EPS)
        inflight += 1

    tasks = [asyncio.create_task(client()) for _ in range(10)]
    await settle()
    inflight = 0  # everything finished at once
    fc.released()
    await settle(50)
    assert inflight == capacity
    assert sum(t.done() for t in tasks) == capacity
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
