"""gRPC health on its own port: NOT_SERVING until the endpoints are synced, SERVING after; Watch; drain."""

from __future__ import annotations

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from picker.endpoints.store import EndpointStore
from picker.extproc.health import READY_SERVICES
from tests.conftest import endpoint
from tests.extproc.conftest import picker

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
SERVICE_UNKNOWN = health_pb2.HealthCheckResponse.SERVICE_UNKNOWN


async def check(stub: health_pb2_grpc.HealthStub, service: str) -> int:
    response = await stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
    return int(response.status)


async def test_not_serving_until_endpoints_are_synced() -> None:
    store = EndpointStore()  # nothing discovered yet
    async with picker(store) as running, grpc.aio.insecure_channel(f"127.0.0.1:{running.health_port}") as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        for service in READY_SERVICES:
            assert await check(stub, service) == NOT_SERVING
        assert await check(stub, "liveness") == SERVING  # alive while waiting for the first sync

        store.set_endpoints([endpoint(1), endpoint(2)], synced=True)
        for service in READY_SERVICES:
            assert await check(stub, service) == SERVING
        assert await check(stub, "no-such-service") == SERVICE_UNKNOWN

        listed = await stub.List(health_pb2.HealthListRequest(), timeout=5)
        assert listed.statuses["inference-extension"].status == SERVING


async def test_watch_follows_changes_and_drain() -> None:
    store = EndpointStore()
    async with picker(store) as running, grpc.aio.insecure_channel(f"127.0.0.1:{running.health_port}") as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        call = stub.Watch(health_pb2.HealthCheckRequest(service="envoy.service.ext_proc.v3.ExternalProcessor"))
        assert (await call.read()).status == NOT_SERVING
        store.set_endpoints([endpoint(1)], synced=True)
        assert (await call.read()).status == SERVING
        running.health.drain()
        assert (await call.read()).status == NOT_SERVING
        call.cancel()


async def test_watch_of_an_unknown_service_says_so_and_stays_open() -> None:
    async with (
        picker(EndpointStore()) as running,
        grpc.aio.insecure_channel(f"127.0.0.1:{running.health_port}") as channel,
    ):
        call = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest(service="other"))
        assert (await call.read()).status == SERVICE_UNKNOWN
        assert not call.done()
        call.cancel()
        assert await call.code() == grpc.StatusCode.CANCELLED  # cancelled by us, not ended by the server


async def test_with_leader_election_readiness_needs_leadership_liveness_does_not() -> None:
    store = EndpointStore()
    store.set_endpoints([endpoint(1)], synced=True)
    async with picker(store) as running, grpc.aio.insecure_channel(f"127.0.0.1:{running.health_port}") as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        call = stub.Watch(health_pb2.HealthCheckRequest(service="readiness"))
        assert (await call.read()).status == SERVING
        running.health.require_leader()  # a standby: synced, warm, but not the leader
        assert (await call.read()).status == NOT_SERVING
        for service in READY_SERVICES:
            assert await check(stub, service) == NOT_SERVING
        assert await check(stub, "liveness") == SERVING
        running.health.set_leader(True)
        assert (await call.read()).status == SERVING
        assert all([await check(stub, s) == SERVING for s in READY_SERVICES])
        running.health.set_leader(False)  # lost the Lease
        assert (await call.read()).status == NOT_SERVING
        running.health.set_leader(True)
        assert (await call.read()).status == SERVING
        running.health.drain()  # shutdown wins over leadership
        assert (await call.read()).status == NOT_SERVING
        assert await check(stub, "liveness") == SERVING
        call.cancel()


async def test_health_is_also_served_on_the_ext_proc_port_with_its_tls() -> None:
    store = EndpointStore()
    store.set_endpoints([endpoint(1)])
    async with picker(store, secure_serving=True) as running:
        assert running.certificate is not None
        creds = grpc.ssl_channel_credentials(running.certificate.cert_pem)
        async with grpc.aio.secure_channel(running.grpc_target, creds) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            request = health_pb2.HealthCheckRequest(service="envoy.service.ext_proc.v3.ExternalProcessor")
            assert (await stub.Check(request)).status == health_pb2.HealthCheckResponse.SERVING
            running.health.drain()
            assert (await stub.Check(request)).status == health_pb2.HealthCheckResponse.NOT_SERVING
