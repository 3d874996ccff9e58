"""The exchange over real gRPC on 127.0.0.1: mutual TLS, reconnects after a peer restarts, limits."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import grpc
import pytest

from picker.extproc import tls
from picker.peers import transport, wire
from picker.peers.transport import Mesh, PeerTls
from tests.conftest import FakeClock
from tests.peers.test_exchange import SYSTEM, Replica, hashes, replica

PAIR = tls.self_signed()


@dataclass
class Node:
    replica: Replica
    server: grpc.aio.Server
    port: int

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"


@contextlib.asynccontextmanager
async def node(
    clock: FakeClock, incarnation: int, pair: tls.CertificatePair | None = PAIR, port: int = 0
) -> AsyncIterator[Node]:
    r = replica(clock, incarnation)
    server = grpc.aio.server(options=transport.SERVER_OPTIONS)
    transport.add_to_server(server, r.exchange, clock)
    address = f"127.0.0.1:{port}"
    if pair is None:
        bound = server.add_insecure_port(address)
    else:
        bound = server.add_secure_port(address, transport.server_credentials(PeerTls(pair)))
    await server.start()
    try:
        yield Node(r, server, bound)
    finally:
        await server.stop(0)


@contextlib.asynccontextmanager
async def meshed(src: Node, peers: list[str], pair: tls.CertificatePair | None = PAIR) -> AsyncIterator[Mesh]:
    mesh = Mesh(src.replica.exchange, tls=PeerTls(pair) if pair else None, clock=src.replica.ctx.clock)
    mesh.set_peers(peers)
    task = asyncio.create_task(mesh.run())
    try:
        yield mesh
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def eventually(check: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not check():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.01)


async def test_placements_and_loads_cross_a_mutual_tls_link(clock: FakeClock) -> None:
    async with node(clock, 1) as a, node(clock, 2) as b, meshed(a, [b.address]) as mesh:
        await eventually(lambda: mesh.connected == [b.address])
        a.replica.route(SYSTEM + "q", 2)
        prompt = SYSTEM + "q"
        want = {"192.168.1.2:8000": len(hashes(b.replica.scorer, prompt))}
        await eventually(lambda: b.replica.matched(prompt) == want)
        await eventually(lambda: b.replica.ctx.ledger_requests("192.168.1.2:8000") == 1)
        assert b.replica.exchange.stats.batches_rejected == 0


async def test_a_client_without_the_pool_certificate_is_refused(clock: FakeClock) -> None:
    other = tls.self_signed()
    async with node(clock, 1, pair=other) as a, node(clock, 2) as b, meshed(a, [b.address], pair=other) as mesh:
        a.replica.route(SYSTEM + "q", 2)
        await asyncio.sleep(1.0)
        assert mesh.connected == []
        assert b.replica.exchange.stats.batches_received == 0
    # and plaintext to the TLS port gets nowhere either
    async with node(clock, 3) as c, node(clock, 4, pair=None) as d, meshed(d, [c.address], pair=None) as plain:
        d.replica.route(SYSTEM + "q", 1)
        await asyncio.sleep(1.0)
        assert c.replica.exchange.stats.batches_received == 0
        assert plain.connected == []


async def test_the_link_comes_back_after_the_peer_restarts(clock: FakeClock) -> None:
    async with node(clock, 1) as a, node(clock, 2) as b:
        port = b.port
        async with meshed(a, [b.address]) as mesh:
            await eventually(lambda: mesh.connected == [b.address])
            a.replica.route(SYSTEM + "q", 3)
            await eventually(lambda: b.replica.ctx.ledger_requests("192.168.1.3:8000") == 1)
            await b.server.stop(0)
            await eventually(lambda: mesh.connected == [])
            async with node(clock, 3, port=port) as b2:  # the peer restarted, empty
                await eventually(lambda: mesh.connected == [b2.address])
                # its in-flight count comes with the first (full) batch of the new connection
                await eventually(lambda: b2.replica.ctx.ledger_requests("192.168.1.3:8000") == 1)
                a.replica.route(SYSTEM + "q", 3)  # and the prefix is announced whole again
                prompt = SYSTEM + "q"
                await eventually(lambda: bool(b2.replica.matched(prompt)))


async def test_a_message_over_the_limit_is_refused_by_grpc(clock: FakeClock) -> None:
    async with node(clock, 1, pair=None) as a, grpc.aio.insecure_channel(a.address) as channel:
        push = channel.stream_unary(transport.PATH)

        async def one(data: bytes) -> AsyncIterator[bytes]:
            yield data

        with pytest.raises(grpc.aio.AioRpcError) as failed:
            await push(one(b"\0" * (wire.MAX_BATCH_BYTES + 4096)))
        assert failed.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        await push(one(b"not a batch"))  # a bad batch is dropped, the stream is fine
        assert a.replica.exchange.stats.batches_rejected == 1


async def test_a_mesh_restarted_by_its_guard_links_again(clock: FakeClock) -> None:
    async with node(clock, 1) as a, node(clock, 2) as b:
        mesh = Mesh(a.replica.exchange, tls=PeerTls(PAIR), clock=a.replica.ctx.clock)
        mesh.set_peers([b.address])  # before run: linked when it starts
        for _ in range(2):  # run, cancelled (a crash the app's guard restarts), run again
            task = asyncio.create_task(mesh.run())
            await eventually(lambda: mesh.connected == [b.address])
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            assert mesh.connected == []
