"""Admission through a real picker (grpc.aio on 127.0.0.1) driven like each gateway: sheddable requests get 429
(or --shed-status) while the pool is saturated, other priorities still route; flow control queues, times out
with 503 and dispatches when the pool frees up."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import AsyncIterator, Callable, Sequence

import orjson
import pytest

from picker.admission import FlowController
from picker.app import Running, serving
from picker.control.policy_resolver import PolicyResolver
from picker.endpoints.model import Endpoint
from picker.endpoints.policy import PolicyStore, policy_of
from picker.endpoints.store import EndpointStore
from tests.conftest import FakeClock, endpoint
from tests.extproc.conftest import make_store, settings
from tests.extproc.gateway import GATEWAYS, Gateway, Outcome, gateway

P1 = "192.168.1.1:8000"
HEADERS = {":method": "POST", ":path": "/v1/completions", "content-type": "application/json"}
SHEDDABLE = {**HEADERS, "x-gateway-inference-objective": "sql-lora-sheddable"}
CRITICAL = {**HEADERS, "x-gateway-inference-objective": "sql-lora"}
BODY = orjson.dumps({"max_tokens": 100, "model": "my-model", "prompt": "test prompt", "temperature": 0})
OBJECTIVES = policy_of({"sql-lora": 2, "sql-lora-sheddable": -1}, [])
# Queues 6, 0, 10 and KV .2, .85, .9: utilisation (1.2 + 1.0625 + 2.0) / 3 ≥ 1 — the reference's saturated pool.
SATURATED = ((6, 0.2), (0, 0.85), (10, 0.9))
IDLE = ((0, 0.1), (1, 0.2), (2, 0.3))

FLOW_CONFIG = """\
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
featureGates: [flowControl]
plugins:
- type: queue-scorer
- type: kv-cache-utilization-scorer
flowControl:
  defaultRequestTTL: %s
"""

BODY_READERS = [g for g in GATEWAYS if g.reads_body]
by_gateway = pytest.mark.parametrize("gw_cls", BODY_READERS, ids=[g.name for g in BODY_READERS])


def pods(loads: Sequence[tuple[int, float]], updated_at: float = 1000.0) -> list[Endpoint]:
    return [endpoint(i + 1, waiting=q, kv=kv, updated_at=updated_at) for i, (q, kv) in enumerate(loads)]


@contextlib.asynccontextmanager
async def stack(
    gw_cls: type[Gateway],
    store: EndpointStore,
    *,
    clock: Callable[[], float],
    config_text: str | None = None,
    **server: object,
) -> AsyncIterator[tuple[Gateway, Running]]:
    base = settings(gateway_profile=gw_cls.server_profile, **server)
    if config_text is not None:
        base = dataclasses.replace(base, config_text=config_text)
    resolver = PolicyResolver(PolicyStore(OBJECTIVES))
    async with (
        serving(base, store=store, scrape=False, resolver=resolver, clock=clock) as running,
        gateway(gw_cls, running.grpc_target) as gw,
    ):
        yield gw, running


@by_gateway
async def test_sheddable_request_is_429_when_saturated_and_others_route(gw_cls: type[Gateway]) -> None:
    async with stack(gw_cls, make_store(pods(SATURATED)), clock=FakeClock(1000.0)) as (gw, _):
        shed = await gw.request(SHEDDABLE, [BODY])
        assert shed.status == 429
        assert shed.error_body == b"inference error: ResourceExhausted - system saturated, sheddable request dropped"
        routed = await gw.request(CRITICAL, [BODY])
        assert routed.status is None
        assert routed.destination == P1
        plain = await gw.request(HEADERS, [BODY])  # no objective: priority 0
        assert plain.status is None


@by_gateway
async def test_sheddable_request_routes_when_the_pool_has_room(gw_cls: type[Gateway]) -> None:
    async with stack(gw_cls, make_store(pods(IDLE)), clock=FakeClock(1000.0)) as (gw, _):
        out = await gw.request(SHEDDABLE, [BODY])
        assert out.status is None
        assert out.destination == P1


async def test_shed_status_503() -> None:
    gw_cls = GATEWAYS[0]
    async with stack(gw_cls, make_store(pods(SATURATED)), clock=FakeClock(1000.0), shed_status=503) as (gw, _):
        out = await gw.request(SHEDDABLE, [BODY])
        assert out.status == 503
        assert out.error_body == b"inference error: ServiceUnavailable - system saturated, sheddable request dropped"


async def test_flow_control_times_out_with_503() -> None:
    gw_cls = GATEWAYS[0]
    store = make_store(pods(SATURATED, updated_at=time.monotonic()))
    async with stack(gw_cls, store, clock=time.monotonic, config_text=FLOW_CONFIG % "50ms") as (gw, running):
        assert isinstance(running.director.admitter, FlowController)
        out = await gw.request(CRITICAL, [BODY])
        assert out.status == 503
        assert out.error_body == (
            b"inference error: ServiceUnavailable - "
            b"request timed out in queue: request evicted from queue: request TTL expired"
        )


@contextlib.asynccontextmanager
async def one_queued(
    store: EndpointStore,
) -> AsyncIterator[tuple[Running, FlowController, asyncio.Task[Outcome]]]:
    """A picker with flow control over a saturated pool, and one request waiting in its queue."""
    async with stack(GATEWAYS[0], store, clock=time.monotonic, config_text=FLOW_CONFIG % "60s") as (gw, running):
        controller = running.director.admitter
        assert isinstance(controller, FlowController)
        pending = asyncio.create_task(gw.request(CRITICAL, [BODY]))
        for _ in range(500):  # bounded: until the request is queued (or the stream failed)
            if len(controller.queue) or pending.done():
                break
            await asyncio.sleep(0.01)
        assert len(controller.queue) == 1
        yield running, controller, pending


async def test_flow_control_dispatches_when_the_pool_frees_up() -> None:
    store = make_store(pods(SATURATED, updated_at=time.monotonic()))
    async with one_queued(store) as (_running, controller, pending):
        now = time.monotonic()
        store.update_metrics({e.key: e.metrics for e in pods(IDLE, updated_at=now)})
        out = await asyncio.wait_for(pending, timeout=10.0)
        assert out.status is None
        assert out.destination == P1
        assert len(controller.queue) == 0


async def test_a_queued_request_whose_client_goes_away_leaves_the_queue() -> None:
    store = make_store(pods(SATURATED, updated_at=time.monotonic()))
    async with one_queued(store) as (running, controller, pending):
        pending.cancel()  # the client resets its stream
        with contextlib.suppress(asyncio.CancelledError):
            await pending
        for _ in range(500):
            if not len(controller.queue) and running.extproc.active == 0:
                break
            await asyncio.sleep(0.01)
        assert len(controller.queue) == 0
        assert running.extproc.active == 0
        assert running.inflight.open_leases == 0
