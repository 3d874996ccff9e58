"""From frames to the index: decoding, per-endpoint ordering, sequence gaps, restarts and resyncs.

One ``Ingestor`` serves the subscriber (``picker.kvevents``), whatever the topology. For each message:

1. decode the three frames (a malformed one is counted by reason and dropped; the index never sees half a
   batch), and name its endpoint from the topic (``ip:port``; an old-style ``kv@ip@model`` topic names the pool
   endpoint at that IP if there is exactly one). An endpoint outside the pool is counted and dropped, so a
   stranger publishing on the socket cannot grow the index;
2. check its sequence number against the endpoint's stream. Batches are numbered 0, 1, 2, ... by each publisher
   process, so:

   * the expected number: apply;
   * higher: a *gap* (the subscriber's queue overflowed, or the connection dropped): counted with the batches
     missed. With a replay socket the caller fetches the missing batches (``Gap``), applies them
     (``replayed``) and then the held message (``close_gap``); without one, or if the replay fails, the
     endpoint is *resynced*: its entries are dropped (the index cannot know what it missed, and stale entries
     would route requests to blocks that are gone), and it is rebuilt from the events that follow;
   * lower than or equal to the last live number: the publisher restarted (a new process, a new cache):
     resync;
   * lower than expected but newer than the last live message: already applied from a replay; skipped.

   The first message from an endpoint with a replay socket asks for the batches before it (a warm start
   when picker starts after the servers).

Events of one endpoint are applied in order; endpoints are independent. Pure: no sockets, no clock.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from picker.kvcache.events import (
    DEFAULT_LIMITS,
    EventBatch,
    Limits,
    MalformedEvent,
    decode_batch,
    decode_sequence,
    parse_topic,
)
from picker.kvcache.index import KVBlockIndex

__all__ = ["Gap", "IngestStats", "Ingestor", "Message"]


@dataclass(frozen=True, slots=True)
class Message:
    endpoint: str
    model: str
    seq: int
    batch: EventBatch


@dataclass(frozen=True, slots=True)
class Gap:
    """``message`` arrived while batches ``first_missing .. message.seq - 1`` were missed: replay them."""

    message: Message
    first_missing: int


@dataclass(slots=True)
class IngestStats:
    messages: int = 0
    applied: int = 0
    events: int = 0
    duplicates: int = 0
    unknown_endpoint: int = 0
    gaps: int = 0
    missed_batches: int = 0
    restarts: int = 0
    replayed: int = 0
    resyncs: Counter[str] = field(default_factory=Counter)  # reason → count
    malformed: Counter[str] = field(default_factory=Counter)  # reason → count


@dataclass(slots=True)
class _Stream:
    expected: int | None = None  # next sequence number to apply
    last_live: int | None = None  # newest live (not replayed) number seen


class Ingestor:
    def __init__(self, indexes: Sequence[KVBlockIndex], limits: Limits = DEFAULT_LIMITS) -> None:
        self.indexes = list(indexes)
        self.limits = limits
        self.stats = IngestStats()
        self._streams: dict[str, _Stream] = {}
        self._pool: frozenset[str] = frozenset()
        self._by_address: dict[str, list[str]] = {}
        self._models: dict[str, str] = {}  # endpoint → the model its topic names (the root of base blocks)

    # -- the pool ---------------------------------------------------------------------------------------------

    def set_endpoints(self, keys: Iterable[str]) -> list[str]:
        """The pool is now ``keys``: endpoints that left lose their entries and stream state; returns them."""
        self._pool = frozenset(keys)
        self._by_address = {}
        for key in self._pool:
            self._by_address.setdefault(_address(key), []).append(key)
        gone = [k for k in self._streams if k not in self._pool]
        for key in gone:
            del self._streams[key]
            self._models.pop(key, None)
        for index in self.indexes:
            gone.extend(k for k in index.retain(self._pool) if k not in gone)
        return gone

    # -- messages ---------------------------------------------------------------------------------------------

    def decode(self, frames: Sequence[bytes]) -> Message | None:
        """The message in ``frames``, or None (counted) when it is malformed or not from a pool endpoint."""
        self.stats.messages += 1
        try:
            if len(frames) != 3:
                raise MalformedEvent("frames", f"{len(frames)} frames")
            topic = parse_topic(frames[0], self.limits)
            seq = decode_sequence(frames[1])
            batch = decode_batch(frames[2], self.limits)
        except MalformedEvent as exc:
            self.stats.malformed[exc.reason] += 1
            return None
        endpoint = topic.endpoint_key
        if endpoint is None:  # old topic: no port
            same_ip = self._by_address.get(topic.address, [])
            endpoint = same_ip[0] if len(same_ip) == 1 else None
        if endpoint is None or endpoint not in self._pool:
            self.stats.unknown_endpoint += 1
            return None
        return Message(endpoint, topic.model, seq, batch)

    def receive(self, frames: Sequence[bytes], *, can_replay: bool = False) -> Gap | None:
        """Apply a live message, or return the ``Gap`` to replay first (only when ``can_replay``)."""
        msg = self.decode(frames)
        if msg is None:
            return None
        stream = self._streams.setdefault(msg.endpoint, _Stream())
        self._models[msg.endpoint] = msg.model
        if stream.last_live is not None and msg.seq <= stream.last_live:
            self.stats.restarts += 1
            self._resync(msg.endpoint, "restart")
            stream.expected = stream.last_live = None
        stream.last_live = msg.seq
        if stream.expected is None:  # first contact
            if can_replay and msg.seq > 0:
                return Gap(msg, 0)
        elif msg.seq < stream.expected:
            self.stats.duplicates += 1
            return None
        elif msg.seq > stream.expected:
            self.stats.gaps += 1
            self.stats.missed_batches += msg.seq - stream.expected
            if can_replay:
                return Gap(msg, stream.expected)
            self._resync(msg.endpoint, "gap")
        self._apply(msg, stream)
        return None

    def replayed(self, endpoint: str, seq: int, payload: bytes) -> None:
        """A batch from the endpoint's replay socket (in order); older than needed ones are skipped."""
        stream = self._streams.get(endpoint)
        if stream is None:
            return
        try:
            batch = decode_batch(payload, self.limits)
        except MalformedEvent as exc:
            self.stats.malformed[exc.reason] += 1
            return
        if stream.expected is not None and seq < stream.expected:
            return
        if stream.expected is not None and seq > stream.expected:  # the replay buffer no longer reaches back
            self._resync(endpoint, "replay-incomplete")
        self.stats.replayed += 1
        self._apply(Message(endpoint, self._models.get(endpoint, ""), seq, batch), stream)

    def close_gap(self, gap: Gap, *, replay_ok: bool) -> None:
        """After the replay (or its failure): apply the held message unless the replay already covered it."""
        msg = gap.message
        stream = self._streams.get(msg.endpoint)
        if stream is None:
            return
        if not replay_ok:
            if gap.first_missing > 0 or stream.expected is not None:
                self._resync(msg.endpoint, "replay-failed")
            stream.expected = None
        if stream.expected is None or msg.seq >= stream.expected:
            if stream.expected is not None and msg.seq > stream.expected:
                self._resync(msg.endpoint, "replay-incomplete")
            self._apply(msg, stream)

    # -- internals --------------------------------------------------------------------------------------------

    def _apply(self, msg: Message, stream: _Stream) -> None:
        for index in self.indexes:
            index.apply(msg.endpoint, msg.model, msg.batch.events)
        stream.expected = msg.seq + 1
        self.stats.applied += 1
        self.stats.events += len(msg.batch.events)

    def _resync(self, endpoint: str, reason: str) -> None:
        self.stats.resyncs[reason] += 1
        for index in self.indexes:
            index.clear(endpoint)


def _address(key: str) -> str:
    if key.startswith("["):
        return key[1 : key.index("]")]
    return key.rpartition(":")[0]
