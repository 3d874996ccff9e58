"""What each ext_proc front must do alike (both run every test here): many interleaved streams, a message that
does not parse, a method the port does not serve, health's Watch and List on the ext_proc port; and the native
front's own choice and fallback rules."""

from __future__ import annotations

import asyncio
import dataclasses

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from picker import errors
from picker.app import serving
from picker.extproc import native, servicer
from tests.conftest import endpoint
from tests.extproc.conftest import make_store, picker, settings
from tests.extproc.gateway import EnvoyFullDuplex, gateway

HEADERS = {":path": "/v1/completions"}
PROCESS = "/envoy.service.ext_proc.v3.ExternalProcessor/Process"
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


async def test_the_front_asked_for_serves_the_port(grpc_frontend: str) -> None:
    async with picker(make_store([endpoint(1)])) as running:
        expected = native.NativeExtProc if grpc_frontend == "native" else servicer.ExtProcServicer
        assert isinstance(running.extproc, expected)


async def test_many_interleaved_streams_each_get_their_own_answer() -> None:
    """Streams on a few connections at once, each body different: every answer belongs to its own request."""
    store = make_store([endpoint(i) for i in range(1, 5)])
    async with picker(store) as running:
        gateways = [EnvoyFullDuplex(running.grpc_target) for _ in range(3)]
        try:

            async def one(i: int) -> None:
                body = b'{"model":"m","prompt":"request %d %s"}' % (i, b"x" * (i * 97 % 5000))
                out = await gateways[i % 3].request(HEADERS, [body[: len(body) // 2], body[len(body) // 2 :]])
                assert out.routed, out
                assert out.upstream_body == body

            await asyncio.gather(*(one(i) for i in range(150)))
        finally:
            for gw in gateways:
                await gw.close()
        assert running.extproc.active == 0  # every stream was ended and forgotten
        assert running.inflight.open_leases == 0


async def test_a_message_that_does_not_parse_fails_its_stream_only() -> None:
    async with (
        picker(make_store([endpoint(1)])) as running,
        grpc.aio.insecure_channel(running.grpc_target) as channel,
    ):
        raw = channel.stream_stream(PROCESS, request_serializer=None, response_deserializer=None)
        call = raw()
        await call.write(b"\xff\xff\xff")  # not a ProcessingRequest
        await call.done_writing()
        with pytest.raises(grpc.aio.AioRpcError) as failed:
            await call.read()
        assert failed.value.code() != grpc.StatusCode.OK
        async with gateway(EnvoyFullDuplex, running.grpc_target) as gw:  # the next stream is served
            assert (await gw.request(HEADERS, [b'{"model":"m","prompt":"p"}'])).routed


async def test_a_method_the_port_does_not_serve_is_unimplemented() -> None:
    async with (
        picker(make_store([endpoint(1)])) as running,
        grpc.aio.insecure_channel(running.grpc_target) as channel,
    ):
        for method in ("/envoy.service.ext_proc.v3.ExternalProcessor/Other", "/no.such.Service/Call"):
            unary = channel.unary_unary(method, request_serializer=None, response_deserializer=None)
            with pytest.raises(grpc.aio.AioRpcError) as failed:
                await unary(b"", timeout=5)
            assert failed.value.code() == grpc.StatusCode.UNIMPLEMENTED


async def test_health_watch_and_list_on_the_ext_proc_port() -> None:
    async with (
        picker(make_store([endpoint(1)])) as running,
        grpc.aio.insecure_channel(running.grpc_target) as channel,
    ):
        stub = health_pb2_grpc.HealthStub(channel)
        listed = await stub.List(health_pb2.HealthListRequest(), timeout=5)
        assert {name: s.status for name, s in listed.statuses.items()} == {
            "": SERVING,
            "inference-extension": SERVING,
            "readiness": SERVING,
            "envoy.service.ext_proc.v3.ExternalProcessor": SERVING,
            "liveness": SERVING,
        }
        unknown = await stub.Check(health_pb2.HealthCheckRequest(service="nope"), timeout=5)
        assert unknown.status == health_pb2.HealthCheckResponse.SERVICE_UNKNOWN

        watch = stub.Watch(health_pb2.HealthCheckRequest(service="readiness"))
        assert (await watch.read()).status == SERVING
        running.health.set_ready(False)
        assert (await asyncio.wait_for(watch.read(), 5)).status == NOT_SERVING
        running.health.set_ready(True)
        assert (await asyncio.wait_for(watch.read(), 5)).status == SERVING
        watch.cancel()


async def test_health_off_the_ext_proc_port_with_health_checking_false() -> None:
    async with (
        picker(make_store([endpoint(1)]), health_checking=False) as running,
        grpc.aio.insecure_channel(running.grpc_target) as channel,
    ):
        with pytest.raises(grpc.aio.AioRpcError) as failed:
            await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
        assert failed.value.code() == grpc.StatusCode.UNIMPLEMENTED


async def test_a_taken_port_is_a_config_error() -> None:
    async with picker(make_store([endpoint(1)])) as running:
        taken = dataclasses.replace(settings().server, grpc_port=running.grpc_port)
        with pytest.raises(errors.ConfigError, match="cannot listen"):
            async with serving(dataclasses.replace(settings(), server=taken), store=make_store([]), scrape=False):
                pass


def test_native_asked_for_but_not_built_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from picker.app import listen

    monkeypatch.setattr(native, "AVAILABLE", False)
    server = dataclasses.replace(settings().server, grpc_frontend="native")
    with pytest.raises(errors.ConfigError, match="not built"):
        listen.native_frontend(server)
    assert not listen.native_frontend(dataclasses.replace(server, grpc_frontend="auto"))  # auto falls back


def test_the_native_front_is_built_here() -> None:
    """scripts/install.sh builds it wherever cargo is (CI included): the native runs above must not fall back."""
    assert native.AVAILABLE
    from picker.extproc import _front  # type: ignore[attr-defined]

    kinds = (_front.MESSAGE, _front.END, _front.GONE, _front.STOPPED)
    assert kinds == (native._MESSAGE, native._END, native._GONE, native._STOPPED)


async def test_the_native_front_queues_a_bounded_amount_when_python_falls_behind() -> None:
    """Python drains nothing for a while: the front stops reading (64 MiB queued at most here) and HTTP/2 flow
    control holds the client back; once Python drains, the rest arrives."""
    from picker.extproc import _front  # type: ignore[attr-defined]

    front = _front.Front("127.0.0.1", 0, max_message=2 << 20, health=False)
    message, count = b"x" * (1 << 20), 160
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{front.port}") as channel:
            call = channel.stream_stream(PROCESS, request_serializer=None, response_deserializer=None)()
            sent = 0

            async def write_all() -> None:
                nonlocal sent
                for _ in range(count):
                    await call.write(message)
                    sent += 1

            writer = asyncio.create_task(write_all())
            await asyncio.sleep(2.0)
            first = [len(p) for _, kind, p in front.drain() if kind == _front.MESSAGE]
            assert 0 < sum(first) <= 64 << 20
            assert not writer.done()  # held back, not buffered without limit
            assert sent < count
            received = len(first)
            async with asyncio.timeout(30):
                while received < count:
                    await asyncio.sleep(0.02)
                    received += sum(kind == _front.MESSAGE for _, kind, _ in front.drain())
                await writer
            assert received == count
            call.cancel()
    finally:
        front.terminate()
