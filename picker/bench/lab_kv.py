"""KV-cache events in the policy lab: the engines' events reach every router after a delay, on the real wire.

When a router's policy has a ``precise-prefix-cache-scorer``, the lab turns event recording on in every engine
(``Engine.record_kv_events``) and, after each engine step, drains what the step stored and evicted into one
batch, encoded exactly as ``picker sim`` publishes it (``sim.kvevents.encode_events``, msgpack, the three frames
``kv@<ip:port>@<model>`` / sequence / payload). The batch is delivered ``delay_s`` later (virtual time: the
ZeroMQ hop and the subscriber's queue) to each router's own ``Ingestor`` (``picker.kvcache.ingest``, the code
``picker serve`` runs), which applies it to that router's scorers' indexes. Each router also gets the prompt's
token ids before it schedules, as the director's token source does (the simulator's tokenizer: what its
``/tokenize`` answers).

A router that restarts gets a fresh index and hears only the batches published after its start (no replay in the
lab), as a subscriber that joins a running publisher without a replay socket.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import msgpack

from picker.bench.policies import Policy, SchedulerPolicy
from picker.kvcache.ingest import Ingestor
from picker.scheduling.plugins.precise_prefix import PrecisePrefixCacheScorer
from picker.sim.engine import Engine
from picker.sim.kvevents import encode_events

__all__ = ["EventBus", "ingestor_for"]


def ingestor_for(policy: Policy, endpoint_keys: Sequence[str]) -> Ingestor | None:
    """An ingestor feeding the policy's precise scorers, or None when it has none (then it needs no events)."""
    if not isinstance(policy, SchedulerPolicy):
        return None
    scorers = [p for p in policy.scheduler.config.plugins.values() if isinstance(p, PrecisePrefixCacheScorer)]
    if not scorers:
        return None
    ingestor = Ingestor([s.index for s in scorers])
    ingestor.set_endpoints(endpoint_keys)
    return ingestor


@dataclass
class EventBus:
    """Batches drained from the engines, waiting for their delivery time."""

    engines: Sequence[Engine]
    topics: Sequence[bytes]
    block_size: int
    lora_ids: dict[str, int]
    delay_s: float
    _seq: list[int] = field(default_factory=list)
    _pending: dict[int, list[bytes]] = field(default_factory=dict)
    _next_id: int = 0
    published: int = 0

    def __post_init__(self) -> None:
        self._seq = [0] * len(self.engines)
        for engine in self.engines:
            engine.record_kv_events = True

    def drain(self, e: int, now: float) -> int | None:
        """Engine ``e``'s new events as one message; returns its id to deliver at ``now + delay_s`` (or None)."""
        events = self.engines[e].drain_kv_events()
        if not events:
            return None
        wire = encode_events(events, block_size=self.block_size, lora_ids=self.lora_ids)
        seq = self._seq[e]
        self._seq[e] = seq + 1
        frames = [self.topics[e], seq.to_bytes(8, "big"), msgpack.packb([now, wire, None])]
        msg_id = self._next_id
        self._next_id += 1
        self._pending[msg_id] = frames
        self.published += 1
        return msg_id

    def deliver(self, msg_id: int, ingestors: Sequence[Ingestor | None]) -> None:
        frames = self._pending.pop(msg_id)
        for ingestor in ingestors:
            if ingestor is not None:
                ingestor.receive(frames)
