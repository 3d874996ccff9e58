"""The simulator's KV events: what the block pool holds, on vLLM's ZeroMQ wire."""

from __future__ import annotations

import asyncio
import random
from array import array

import msgpack
import pytest
import zmq
import zmq.asyncio

from picker.kvcache import KVBlockIndex, decode_batch, decode_sequence, parse_topic
from picker.kvcache.events import AllBlocksCleared, BlockRemoved, BlockStored
from picker.sim.config import preset
from picker.sim.engine import Engine, KVCleared, KVRemoved, KVStored, SimRequest
from picker.sim.kvevents import END_SEQ, KVEventPublisher, encode_events
from picker.sim.server import KVEventsOptions, ServerConfig, SimServer
from picker.sim.tokenizer import default_tokenizer

WORDS = default_tokenizer().word_ids
EP = "127.0.0.1:8000"


def run_to_idle(engine: Engine, now: float = 0.0) -> float:
    while engine.has_work:
        end = engine.begin_step(now)
        assert end is not None
        engine.finish_step()
        now = end
    return now


def shared_prefix_prompts(rng: random.Random, groups: int, n: int) -> list[list[int]]:
    heads = [[rng.choice(WORDS) for _ in range(200)] for _ in range(groups)]
    return [heads[rng.randrange(groups)] + [rng.choice(WORDS) for _ in range(rng.randrange(20, 80))] for _ in range(n)]


@pytest.mark.parametrize("map_format", [False, True])
def test_events_replayed_into_the_index_equal_the_pool(map_format: bool) -> None:
    """Under cache pressure (evictions), the index built from the events is exactly the pool's cached set."""
    cfg = preset("fast", num_gpu_blocks=96, block_size=16, max_num_seqs=4, lora_adapters=("ad",), max_loras=1)
    engine = Engine(cfg)
    engine.record_kv_events = True
    index = KVBlockIndex()
    rng = random.Random(3)
    now = 0.0
    for i, ids in enumerate(shared_prefix_prompts(rng, 6, 60)):
        engine.submit(SimRequest(f"r{i}", ids, max_tokens=8, ignore_eos=True, lora="ad" if i % 7 == 0 else None), now)
        now = run_to_idle(engine, now)
        wire = encode_events(engine.drain_kv_events(), block_size=16, lora_ids={"ad": 1}, map_format=map_format)
        index.apply(EP, cfg.model, decode_batch(msgpack.packb([now, wire, None])).events)
    cached = set(engine.pool._cached)
    assert index.stats.removed_blocks > 0  # the pool did evict
    assert index.stats.unknown_parent == 0
    assert index.entries == len(cached)
    # The simulator hashes blocks as picker keys them, so the request keys are the pool's own hashes.
    assert set(index._holders) == cached
    for ids in shared_prefix_prompts(random.Random(4), 6, 20):
        keys = index.request_keys(ids, 16, cfg.model)
        assert index.match(keys, [EP]).get(EP, 0.0) == len(engine.pool.lookup(keys))


def test_clear_cache_emits_all_cleared_and_is_refused_while_running() -> None:
    engine = Engine(preset("fast"))
    engine.record_kv_events = True
    engine.submit(SimRequest("a", list(WORDS[:64]), max_tokens=4, ignore_eos=True), 0.0)
    engine.begin_step(0.0)
    assert not engine.clear_cache()
    engine.finish_step()
    run_to_idle(engine, 1.0)
    assert engine.clear_cache()
    events = engine.drain_kv_events()
    assert isinstance(events[0], KVStored)
    assert events[0].parent_block_hash is None
    assert isinstance(events[-1], KVCleared)
    assert not any(isinstance(e, KVRemoved) for e in events)
    assert engine.pool.num_cached == 0


async def test_publisher_wire_format_and_replay() -> None:
    pub = KVEventPublisher(
        topic="kv@10.1.2.3:8000@m", block_size=16, bind="tcp://127.0.0.1:0", replay_bind="tcp://127.0.0.1:0",
        batch_size=2,
    )  # fmt: skip
    await pub.start()
    ctx = zmq.asyncio.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"kv@")
    sub.connect(f"tcp://127.0.0.1:{pub.port}")
    try:
        events = [KVStored([1, 2], None, list(range(32)), None), KVRemoved([1]), KVCleared()]
        # PUB/SUB joins asynchronously: publish until the subscriber sees something.
        for _ in range(200):
            pub.publish(events, 5.0)
            if await sub.poll(20):
                break
        topic, seq, payload = await asyncio.wait_for(sub.recv_multipart(), 2)
        assert parse_topic(topic).endpoint_key == "10.1.2.3:8000"
        first_seen = decode_sequence(seq)
        batch = decode_batch(payload)
        # batches of 2: [stored, removed], then [cleared]
        first = (BlockStored((1, 2), None, array("I", range(32)), 16), BlockRemoved((1,)))
        assert batch.events == (first if first_seen % 2 == 0 else (AllBlocksCleared(),))
        # Replay from 0: every buffered batch in order, then the end marker.
        dealer = ctx.socket(zmq.DEALER)
        dealer.connect(f"tcp://127.0.0.1:{pub.replay_port}")
        await dealer.send_multipart((b"", (0).to_bytes(8, "big")))
        seqs = []
        while True:
            _, seq_frame, body = await asyncio.wait_for(dealer.recv_multipart(), 2)
            if seq_frame == END_SEQ:
                break
            seqs.append(decode_sequence(seq_frame))
            decode_batch(body)
        assert seqs == list(range(pub.seq))
        assert first_seen in seqs
        dealer.close(0)
    finally:
        sub.close(0)
        ctx.term()
        await pub.stop()


async def test_server_publishes_after_steps_and_restarts_its_sequence_on_crash() -> None:
    opts = KVEventsOptions(port=0)
    async with SimServer(preset("fast"), ServerConfig(port=0, kv_events=opts)) as server:
        assert server.kv_publisher is not None
        assert server.kv_publisher.port
        ctx = zmq.asyncio.Context()
        sub = ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        sub.connect(f"tcp://127.0.0.1:{server.kv_publisher.port}")
        try:
            await asyncio.sleep(0.2)  # let the subscription reach the publisher
            server.driver.submit(SimRequest("x", list(WORDS[:40]), max_tokens=2, ignore_eos=True))
            topic, seq, payload = await asyncio.wait_for(sub.recv_multipart(), 5)
            assert topic == f"kv@127.0.0.1:{server.port}@sim-model".encode()
            assert decode_sequence(seq) == 0
            (ev,) = decode_batch(payload).events
            assert isinstance(ev, BlockStored)
            assert len(ev.block_hashes) == 2
            await server.crash()
            assert server.kv_publisher.seq == 0
        finally:
            sub.close(0)
            ctx.term()
