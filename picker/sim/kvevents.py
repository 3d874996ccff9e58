"""The simulator's KV-event publisher: the engine's cache events on vLLM's ZeroMQ wire (model-servers.md §4).

Each message is three frames: topic ``kv@<ip>:<port>@<model>``, an 8-byte big-endian sequence number (0, 1, 2,
... per batch, from the publisher's start) and a msgpack ``[ts, [event, ...], data_parallel_rank]``. Events are
vLLM's arrays (``["BlockStored", hashes, parent, token_ids, block_size, lora_id, "GPU", lora_name]``,
``["BlockRemoved", hashes, "GPU"]``, ``["AllBlocksCleared"]``) or, with ``map_format``, maps with a ``type`` key
and the same fields by name (vLLM's ``--kv-events-config`` map encoding).

Topologies: ``bind`` (``tcp://*:5557``, what vLLM's default endpoint does; the router's subscriber dials each
server) or ``connect`` (the router binds one socket and every server dials it: llm-d-inference-sim's
``--zmq-endpoint``). Batches go out after every engine step, at most ``batch_size`` events each. A PUB socket
never blocks: past the high-water mark a slow subscriber misses batches, which it sees as a sequence gap.

Replay (``replay_bind``): a ROUTER socket keeps the last ``buffer_steps`` batches; a DEALER that sends
``["", start_seq]`` gets ``["", seq, payload]`` for every buffered batch from ``start_seq`` on, then
``["", 0xFFFFFFFFFFFFFFFF, ""]`` (vLLM's ``ZmqEventPublisher`` replay service).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import msgpack
import zmq
import zmq.asyncio

from picker.sim.engine import KVCleared, KVEvent, KVRemoved, KVStored

__all__ = ["END_SEQ", "KVEventPublisher", "encode_events"]

log = logging.getLogger(__name__)

END_SEQ = b"\xff" * 8
_MEDIUM = "GPU"


def encode_events(
    events: Iterable[KVEvent], *, block_size: int, lora_ids: Mapping[str, int], map_format: bool = False
) -> list[Any]:
    """vLLM's msgpack shapes of ``events`` (arrays, or maps with ``map_format``)."""
    out: list[Any] = []
    for ev in events:
        if type(ev) is KVStored:
            lora_id = lora_ids.get(ev.lora) if ev.lora is not None else None
            if map_format:
                out.append(
                    {
                        "type": "BlockStored",
                        "block_hashes": ev.block_hashes,
                        "parent_block_hash": ev.parent_block_hash,
                        "token_ids": ev.token_ids,
                        "block_size": block_size,
                        "lora_id": lora_id,
                        "medium": _MEDIUM,
                        "lora_name": ev.lora,
                    }
                )
            else:
                row = [ev.block_hashes, ev.parent_block_hash, ev.token_ids, block_size, lora_id, _MEDIUM, ev.lora]
                out.append(["BlockStored", *row])
        elif type(ev) is KVRemoved:
            if map_format:
                out.append({"type": "BlockRemoved", "block_hashes": ev.block_hashes, "medium": _MEDIUM})
            else:
                out.append(["BlockRemoved", ev.block_hashes, _MEDIUM])
        elif type(ev) is KVCleared:
            out.append({"type": "AllBlocksCleared"} if map_format else ["AllBlocksCleared"])
    return out


class KVEventPublisher:
    def __init__(
        self,
        *,
        topic: str,
        block_size: int,
        lora_adapters: Sequence[str] = (),
        bind: str | None = None,
        connect: str | None = None,
        replay_bind: str | None = None,
        batch_size: int = 16,
        map_format: bool = False,
        buffer_steps: int = 10_000,
        dp_rank: int | None = None,
        high_water_mark: int = 100_000,
    ) -> None:
        if (bind is None) == (connect is None):
            raise ValueError("give exactly one of bind and connect")
        if batch_size < 1:
            raise ValueError("batch_size must be >= 1")
        self.topic = topic.encode()
        self.block_size = block_size
        self.lora_ids = {name: i + 1 for i, name in enumerate(lora_adapters)}  # vLLM numbers adapters from 1
        self.bind = bind
        self.connect = connect
        self.replay_bind = replay_bind
        self.batch_size = batch_size
        self.map_format = map_format
        self.dp_rank = dp_rank
        self.high_water_mark = high_water_mark
        self.seq = 0
        self.sent_batches = 0
        self.dropped_batches = 0
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=buffer_steps)
        self._ctx = zmq.asyncio.Context()
        self._pub: zmq.asyncio.Socket | None = None
        self._replay: zmq.asyncio.Socket | None = None
        self._replay_task: asyncio.Task[None] | None = None
        self.port: int | None = None  # the PUB socket's bound port (bind mode)
        self.replay_port: int | None = None

    async def start(self) -> None:
        pub = self._ctx.socket(zmq.PUB)
        pub.setsockopt(zmq.SNDHWM, self.high_water_mark)
        pub.setsockopt(zmq.LINGER, 0)
        if self.bind is not None:
            self.port = _bind(pub, self.bind)
        else:
            assert self.connect is not None
            pub.connect(self.connect)
        self._pub = pub
        if self.replay_bind is not None:
            replay = self._ctx.socket(zmq.ROUTER)
            replay.setsockopt(zmq.LINGER, 0)
            self.replay_port = _bind(replay, self.replay_bind)
            self._replay = replay
            self._replay_task = asyncio.create_task(self._serve_replay(replay), name="sim-kv-replay")

    async def stop(self) -> None:
        if self._replay_task is not None:
            self._replay_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._replay_task
        for sock in (self._pub, self._replay):
            if sock is not None:
                sock.close(linger=0)
        self._pub = self._replay = None
        self._ctx.term()

    def restart(self) -> None:
        """A restarted server's publisher: sequence numbers start again at 0 and the replay buffer is empty."""
        self.seq = 0
        self._buffer.clear()

    def publish(self, events: Sequence[KVEvent], ts: float) -> None:
        """Send ``events`` now, in batches of at most ``batch_size``."""
        if not events or self._pub is None:
            return
        for start in range(0, len(events), self.batch_size):
            chunk = encode_events(
                events[start : start + self.batch_size],
                block_size=self.block_size,
                lora_ids=self.lora_ids,
                map_format=self.map_format,
            )
            payload: bytes = msgpack.packb([ts, chunk, self.dp_rank])
            seq = self.seq
            self.seq += 1
            self._buffer.append((seq, payload))
            try:
                self._pub.send_multipart((self.topic, seq.to_bytes(8, "big"), payload), flags=zmq.NOBLOCK)
                self.sent_batches += 1
            except zmq.Again:  # past the high-water mark: the subscriber will see a gap
                self.dropped_batches += 1

    async def _serve_replay(self, sock: zmq.asyncio.Socket) -> None:
        while True:
            frames = await sock.recv_multipart()
            if len(frames) != 3 or len(frames[2]) != 8:
                log.warning("kv replay: ignoring a request of %d frames", len(frames))
                continue
            client, _, start_bytes = frames
            start = int.from_bytes(start_bytes, "big")
            for seq, payload in list(self._buffer):
                if seq >= start:
                    await sock.send_multipart((client, b"", seq.to_bytes(8, "big"), payload))
            await sock.send_multipart((client, b"", END_SEQ, b""))


def _bind(sock: zmq.asyncio.Socket, address: str) -> int:
    """Bind ``address`` (``tcp://host:0`` picks a free port); returns the port."""
    sock.bind(address)
    endpoint = sock.getsockopt(zmq.LAST_ENDPOINT)
    assert isinstance(endpoint, bytes)
    return int(endpoint.decode().rsplit(":", 1)[1])
