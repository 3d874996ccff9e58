"""The KV-event subscriber on real ZeroMQ sockets: both topologies and encodings, gaps, replay, restarts,
endpoints leaving, a bounded queue, and garbage on the wire."""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import AsyncIterator, Callable

import msgpack
import pytest
import zmq
import zmq.asyncio

from picker import procutil
from picker.bench import procs
from picker.endpoints.model import Endpoint
from picker.endpoints.store import EndpointStore
from picker.kvcache import KVBlockIndex, block_keys, root_key
from picker.kvcache.ingest import Ingestor
from picker.kvevents.subscriber import KVEventSubscriber, SubscriberSettings, publisher_addresses
from picker.sim.engine import KVCleared, KVRemoved, KVStored
from picker.sim.kvevents import KVEventPublisher

BS = 16
MODEL = "m"


def free_port() -> int:
    return procs.free_port()  # outside the ephemeral range: no outgoing connection takes it meanwhile


def blocks(n: int, start: int = 0) -> list[int]:
    return list(range(start, start + n * BS))


def held(index: KVBlockIndex, key: str, tokens: list[int]) -> float:
    return index.match(block_keys(tokens, BS, root_key(MODEL)), [key]).get(key, 0.0)


async def eventually(check: Callable[[], bool], timeout_s: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not check():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.01)


class Pool:
    """A store of endpoints on 127.0.0.1 whose publishers run in this test (ports on the same IP: ranks)."""

    def __init__(self, n: int, **settings: object) -> None:
        self.http_ports = sorted(free_port() for _ in range(n))
        self.kv_base = procutil.free_ports(n, consecutive=True)[0]
        self.endpoints = [Endpoint.create("127.0.0.1", p) for p in self.http_ports]
        self.store = EndpointStore()
        self.store.set_endpoints(self.endpoints)
        self.index = KVBlockIndex()
        self.ingestor = Ingestor([self.index])
        self.subscriber = KVEventSubscriber(self.ingestor, SubscriberSettings(socket_port=self.kv_base, **settings))  # type: ignore[arg-type]

    def key(self, i: int) -> str:
        return self.endpoints[i].key

    def publisher(self, i: int, **kw: object) -> KVEventPublisher:
        kw.setdefault("bind", f"tcp://127.0.0.1:{self.kv_base + i}")
        return KVEventPublisher(topic=f"kv@{self.key(i)}@{MODEL}", block_size=BS, **kw)  # type: ignore[arg-type]


@contextlib.asynccontextmanager
async def running(pool: Pool, *publishers: KVEventPublisher) -> AsyncIterator[asyncio.Task[None]]:
    for p in publishers:
        await p.start()
    task = asyncio.create_task(pool.subscriber.run(store=pool.store))
    try:
        yield task
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        pool.subscriber.terminate()
        for p in publishers:
            await p.stop()


async def publish_until(pool: Pool, pub: KVEventPublisher, events: list[object], done: Callable[[], bool]) -> None:
    """PUB/SUB joins asynchronously: the first batches can go nowhere. Send a harmless probe (a removal of an
    unknown block, which the index counts) until one arrives, then the real batch."""
    before = pool.index.stats.unknown_removed
    for _ in range(500):
        pub.publish([KVRemoved([12345])], 0.0)
        await asyncio.sleep(0.01)
        if pool.index.stats.unknown_removed > before:
            break
    pub.publish(events, 0.0)  # type: ignore[arg-type]
    await eventually(done)


@pytest.mark.parametrize("map_format", [False, True])
async def test_per_endpoint_connect_both_encodings(map_format: bool) -> None:
    pool = Pool(2)
    pubs = [pool.publisher(i, map_format=map_format) for i in range(2)]
    async with running(pool, *pubs):
        for i, pub in enumerate(pubs):
            t = blocks(3, start=1000 * i)
            await publish_until(
                pool,
                pub,
                [KVStored([1, 2, 3], None, t, None)],
                lambda t=t, i=i: held(pool.index, pool.key(i), t) == 3.0,
            )  # type: ignore[misc]
        assert held(pool.index, pool.key(0), blocks(3, 1000)) == 0.0  # each endpoint holds only its own
        pubs[0].publish([KVRemoved([3])], 0.0)
        await eventually(lambda: held(pool.index, pool.key(0), blocks(3)) == 2.0)
        pubs[1].publish([KVCleared()], 0.0)
        await eventually(lambda: pool.index.endpoint_blocks(pool.key(1)) == 0)
    assert pool.ingestor.stats.gaps == 0


async def test_central_bind_mode() -> None:
    pool = Pool(2, discover=False, bind="tcp://127.0.0.1:0")
    pool.subscriber.start()
    central = f"tcp://127.0.0.1:{pool.subscriber.bound_port}"
    pubs = [pool.publisher(i, bind=None, connect=central) for i in range(2)]
    async with running(pool, *pubs):
        for i, pub in enumerate(pubs):
            t = blocks(2, start=500 * i)
            await publish_until(
                pool, pub, [KVStored([7, 8], None, t, None)], lambda t=t, i=i: held(pool.index, pool.key(i), t) == 2.0
            )  # type: ignore[misc]


async def test_gap_without_replay_resyncs_then_rebuilds() -> None:
    pool = Pool(1)
    pub = pool.publisher(0)
    async with running(pool, pub):
        await publish_until(
            pool,
            pub,
            [KVStored([1, 2], None, blocks(2), None)],
            lambda: held(pool.index, pool.key(0), blocks(2)) == 2.0,
        )
        pub.seq += 3  # three batches lost on the way
        pub.publish([KVStored([9], None, blocks(1, 7000), None)], 0.0)
        await eventually(lambda: pool.ingestor.stats.gaps == 1)
        assert pool.ingestor.stats.missed_batches == 3
        assert pool.ingestor.stats.resyncs["gap"] == 1
        assert held(pool.index, pool.key(0), blocks(2)) == 0.0  # forgotten: it may have been removed meanwhile
        assert held(pool.index, pool.key(0), blocks(1, 7000)) == 1.0


async def test_gap_with_replay_fills_in_from_the_router_socket() -> None:
    replay_base = free_port()
    pool = Pool(1, replay_port=replay_base)
    pub = pool.publisher(0, replay_bind=f"tcp://127.0.0.1:{replay_base}")
    async with running(pool, pub):
        await publish_until(
            pool, pub, [KVStored([1], None, blocks(1), None)], lambda: held(pool.index, pool.key(0), blocks(1)) == 1.0
        )
        # Two batches the subscriber never gets live (dropped on the way), but the replay buffer has them.
        for h, parent, t in ((2, 1, blocks(1, BS)), (3, 2, blocks(1, 2 * BS))):
            payload = msgpack.packb([0.0, [["BlockStored", [h], parent, t, BS, None, "GPU", None]], None])
            pub._buffer.append((pub.seq, payload))
            pub.seq += 1
        pub.publish([KVStored([4], 3, blocks(1, 3 * BS), None)], 0.0)
        await eventually(lambda: held(pool.index, pool.key(0), blocks(4)) == 4.0)
        assert pool.ingestor.stats.gaps == 1
        assert pool.ingestor.stats.replayed >= 2
        assert pool.ingestor.stats.resyncs.total() == 0


async def test_publisher_restart_and_endpoint_leaving() -> None:
    pool = Pool(2)
    pubs = [pool.publisher(i) for i in range(2)]
    async with running(pool, *pubs):
        for i, pub in enumerate(pubs):
            await publish_until(
                pool,
                pub,
                [KVStored([1, 2], None, blocks(2), None)],
                lambda i=i: held(pool.index, pool.key(i), blocks(2)) == 2.0,
            )  # type: ignore[misc]
        pubs[0].restart()  # a new server process: numbering starts at 0, its cache is empty
        pubs[0].publish([KVStored([5], None, blocks(1, 300), None)], 0.0)
        await eventually(lambda: pool.ingestor.stats.restarts == 1)
        assert held(pool.index, pool.key(0), blocks(2)) == 0.0
        assert held(pool.index, pool.key(0), blocks(1, 300)) == 1.0
        # endpoint 1 leaves: its entries go at once and later messages from it are dropped
        pool.store.set_endpoints([pool.endpoints[0]])
        assert held(pool.index, pool.key(1), blocks(2)) == 0.0
        assert pool.key(1) not in pool.subscriber._connected
        # and comes back: reconnected, rebuilt from what it publishes next
        pool.store.set_endpoints(pool.endpoints)
        for _ in range(500):  # the new connection joins asynchronously
            pubs[1].publish([KVStored([1, 2], None, blocks(2), None)], 0.0)
            await asyncio.sleep(0.01)
            if held(pool.index, pool.key(1), blocks(2)) == 2.0:
                break
        assert held(pool.index, pool.key(1), blocks(2)) == 2.0


async def test_bounded_queue_overflow_shows_as_a_gap() -> None:
    """A burst the subscriber cannot take (the loop is busy): the high-water marks drop batches instead of
    growing a queue, and the subscriber sees the hole as a sequence gap and resyncs."""
    pool = Pool(1, queue_size=20)
    pub = pool.publisher(0, high_water_mark=20)
    async with running(pool, pub):
        await publish_until(
            pool, pub, [KVStored([1], None, blocks(1), None)], lambda: held(pool.index, pool.key(0), blocks(1)) == 1.0
        )
        big = [KVRemoved(list(range(10**6, 10**6 + 200)))]
        for _ in range(20_000):  # no await: the subscriber cannot read meanwhile (~36 MB, past any buffer)
            pub.publish(big, 0.0)  # type: ignore[arg-type]
        await asyncio.sleep(0.2)
        pub.publish([KVStored([1], None, blocks(1), None)], 0.0)
        await eventually(lambda: pool.ingestor.stats.gaps >= 1, timeout_s=20)
        assert pool.ingestor.stats.missed_batches > 0
        assert pool.ingestor.stats.resyncs["gap"] >= 1
        assert pool.ingestor.stats.applied < 20_000


async def test_garbage_frames_are_counted_and_dropped() -> None:
    pool = Pool(1)
    ctx = zmq.asyncio.Context()
    raw = ctx.socket(zmq.PUB)
    raw.bind(f"tcp://127.0.0.1:{pool.kv_base}")
    rng = random.Random(5)
    key = pool.key(0)
    good_topic = f"kv@{key}@{MODEL}".encode()
    task = asyncio.create_task(pool.subscriber.run(store=pool.store))
    try:
        ok = msgpack.packb([0.0, [["BlockStored", [1], None, blocks(1), BS]], None])
        # wait for the subscription to arrive, with valid messages at seq 0
        for _ in range(500):
            await raw.send_multipart((good_topic, (0).to_bytes(8, "big"), ok))
            await asyncio.sleep(0.01)
            if pool.ingestor.stats.applied:
                break
        garbage = [
            [good_topic],
            [good_topic, b"\x00" * 8],
            [good_topic, b"\x01", ok],
            [good_topic, (1).to_bytes(8, "big"), b"\xc1\xc1"],
            [b"kv@nonsense", (1).to_bytes(8, "big"), ok],
            [good_topic, (1).to_bytes(8, "big"), msgpack.packb([0.0, [["BlockStored", [1]]], None])],
            [good_topic, (1).to_bytes(8, "big"), b"\x92" + b"\xdd\xff\xff\xff\xff"],  # claims a 4G-entry array
        ]
        garbage += [[good_topic, (1).to_bytes(8, "big"), rng.randbytes(rng.randrange(1, 200))] for _ in range(200)]
        for frames in garbage:
            await raw.send_multipart(frames)
        applied = pool.ingestor.stats.applied
        await raw.send_multipart(
            (good_topic, (1).to_bytes(8, "big"), msgpack.packb([0.0, [["BlockRemoved", [1]]], None]))
        )
        await eventually(lambda: pool.ingestor.stats.applied == applied + 1)
        assert sum(pool.ingestor.stats.malformed.values()) >= 7
        assert held(pool.index, key, blocks(1)) == 0.0  # the valid message after the garbage applied
        assert not task.done()
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        pool.subscriber.terminate()
        raw.close(0)
        ctx.term()


def test_publisher_addresses_follow_ranks() -> None:
    got = publisher_addresses([("a", "10.0.0.1", 8001), ("b", "10.0.0.1", 8000), ("c", "fd00::1", 8000)], 5557)
    assert got == {"b": "tcp://10.0.0.1:5557", "a": "tcp://10.0.0.1:5558", "c": "tcp://[fd00::1]:5557"}
