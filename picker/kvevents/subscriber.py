"""The KV-event subscriber: ZeroMQ SUB sockets fed into the ``Ingestor`` (``picker.kvcache.ingest``).

One SUB socket (``zmq.asyncio``), subscribed to ``topicFilter`` (``kv@``), which

* with ``discoverPods`` *connects* to every pool endpoint's publisher as the pool changes: endpoint
  ``ip:port`` → ``tcp://ip:socketPort + r``, r being the endpoint's rank among the endpoints of that IP in port
  order (vLLM's data-parallel ranks serve on port + r and publish on socketPort + r; a plain pod has r = 0);
  endpoints that leave are disconnected and their entries dropped;
* with ``zmqEndpoint`` *binds* there (central mode: the servers dial in), e.g. ``tcp://*:5557``.

Messages are handled one at a time in arrival order, so each publisher's batches apply in order. The socket's
receive high-water mark (``queueSize`` messages) bounds what waits: past it the publisher drops, which shows
up as a sequence gap, and the endpoint is replayed (``replaySocketPort``: vLLM's replay ROUTER, asked with a
DEALER for the missed batches, ``replay_timeout_s`` at most) or resynced. Every frame is size-capped
(``ZMQ_MAXMSGSIZE``) and validated before use; malformed messages are counted and dropped. The loop yields to
the event loop every ``yield_every`` messages, so a burst of events never stalls request handling.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterable
from dataclasses import dataclass

import zmq
import zmq.asyncio

from picker.endpoints.model import EndpointSnapshot
from picker.endpoints.store import EndpointStore
from picker.kvcache.ingest import Gap, Ingestor

__all__ = ["END_SEQ", "KVEventSubscriber", "SubscriberSettings", "publisher_addresses"]

log = logging.getLogger(__name__)

END_SEQ = b"\xff" * 8


@dataclass(frozen=True, slots=True)
class SubscriberSettings:
    topic_filter: str = "kv@"
    discover: bool = True
    socket_port: int = 5557
    replay_port: int = 0  # 0: no replay socket
    bind: str = ""  # central mode: bind here
    queue_size: int = 10_000
    max_message_bytes: int = 8 * 1024 * 1024
    replay_timeout_s: float = 1.0
    replay_max_batches: int = 100_000
    yield_every: int = 64


def publisher_addresses(endpoints: Iterable[tuple[str, str, int]], base_port: int) -> dict[str, str]:
    """endpoint key → ``tcp://ip:port`` of its publisher, for (key, ip, port) triples (see the module doc)."""
    by_ip: dict[str, list[tuple[int, str]]] = {}
    for key, address, port in endpoints:
        by_ip.setdefault(address, []).append((port, key))
    out: dict[str, str] = {}
    for address, ranks in by_ip.items():
        host = f"[{address}]" if ":" in address else address
        for rank, (_, key) in enumerate(sorted(ranks)):
            out[key] = f"tcp://{host}:{base_port + rank}"
    return out


class KVEventSubscriber:
    def __init__(self, ingestor: Ingestor, settings: SubscriberSettings) -> None:
        if not settings.discover and not settings.bind:
            raise ValueError("discover or bind (or both)")
        self.ingestor = ingestor
        self.settings = settings
        self._ctx = zmq.asyncio.Context()
        self._sock: zmq.asyncio.Socket | None = None
        self._connected: dict[str, str] = {}  # endpoint key → publisher address
        self._replay_addresses: dict[str, str] = {}
        self._keys: frozenset[str] | None = None
        self._store: EndpointStore | None = None
        self.bound_port: int | None = None  # central mode, after start

    # -- lifecycle --------------------------------------------------------------------------------------------

    def start(self) -> zmq.asyncio.Socket:
        """Open (and in central mode bind) the socket; raises ``zmq.ZMQError`` (e.g. the address is in use)."""
        s = self.settings
        sock = self._ctx.socket(zmq.SUB)
        sock.setsockopt(zmq.RCVHWM, s.queue_size)
        sock.setsockopt(zmq.MAXMSGSIZE, s.max_message_bytes)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SUBSCRIBE, s.topic_filter.encode())
        if s.bind:
            sock.bind(s.bind)
            endpoint = sock.getsockopt(zmq.LAST_ENDPOINT)
            assert isinstance(endpoint, bytes)
            self.bound_port = int(endpoint.decode().rsplit(":", 1)[1])
        self._sock = sock
        return sock

    def close(self) -> None:
        """Close the socket (``run`` opens a new one if it runs again)."""
        if self._sock is not None:
            self._sock.close(linger=0)
            self._sock = None
        self._connected.clear()
        self._keys = None

    def terminate(self) -> None:
        self.close()
        self._ctx.term()

    async def run(self, *, store: EndpointStore) -> None:
        """Follow ``store``'s membership and apply events until cancelled."""
        sock = self._sock or self.start()
        if self._store is not store:
            self._store = store
            store.subscribe(self.on_snapshot)
        self.on_snapshot(store.current())
        try:
            n = 0
            while True:
                frames = await sock.recv_multipart(copy=True)
                gap = self.ingestor.receive(frames, can_replay=self.settings.replay_port > 0)
                if gap is not None:
                    await self._replay(gap)
                n += 1
                if n % self.settings.yield_every == 0:
                    await asyncio.sleep(0)
        finally:
            self.close()

    # -- membership -------------------------------------------------------------------------------------------

    def on_snapshot(self, snap: EndpointSnapshot) -> None:
        keys = frozenset(e.key for e in snap.endpoints)
        if keys == self._keys:
            return
        self._keys = keys
        gone = self.ingestor.set_endpoints(keys)
        if gone:
            log.info("kv events: %d endpoint(s) left the pool; their index entries are dropped", len(gone))
        triples = [(e.key, e.address, e.port) for e in snap.endpoints]
        if self.settings.replay_port:
            self._replay_addresses = publisher_addresses(triples, self.settings.replay_port)
        if not self.settings.discover or self._sock is None:
            return
        wanted = publisher_addresses(triples, self.settings.socket_port)
        for key, address in list(self._connected.items()):
            if wanted.get(key) != address:
                with contextlib.suppress(zmq.ZMQError):
                    self._sock.disconnect(address)
                del self._connected[key]
        for key, address in wanted.items():
            if key not in self._connected:
                self._sock.connect(address)
                self._connected[key] = address

    # -- replay -----------------------------------------------------------------------------------------------

    async def _replay(self, gap: Gap) -> None:
        endpoint = gap.message.endpoint
        address = self._replay_addresses.get(endpoint)
        ok = False
        if address is not None:
            try:
                fetch = self._fetch(endpoint, address, gap.first_missing)
                ok = await asyncio.wait_for(fetch, self.settings.replay_timeout_s)
            except (TimeoutError, zmq.ZMQError) as exc:
                log.info("kv events: replay from %s failed (%s); resyncing", endpoint, type(exc).__name__)
        self.ingestor.close_gap(gap, replay_ok=ok)

    async def _fetch(self, endpoint: str, address: str, start: int) -> bool:
        dealer = self._ctx.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        dealer.setsockopt(zmq.MAXMSGSIZE, self.settings.max_message_bytes)
        try:
            dealer.connect(address)
            await dealer.send_multipart((b"", start.to_bytes(8, "big")))
            for _ in range(self.settings.replay_max_batches):
                frames = await dealer.recv_multipart()
                if len(frames) != 3 or len(frames[1]) != 8:
                    return False
                _, seq, payload = frames
                if seq == END_SEQ:
                    return True
                self.ingestor.replayed(endpoint, int.from_bytes(seq, "big"), payload)
            return False
        finally:
            dealer.close(linger=0)
