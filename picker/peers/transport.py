"""The peer exchange over gRPC: one client stream of batches from each replica to each peer, mutual TLS.

Service ``/picker.peers.v1.Exchange/Push``: a client-streaming call whose messages are raw ``wire`` batches (no
protobuf: bytes in, bytes out) and whose response is empty. Each replica

* serves the method on its peer port (``add_to_server``); every batch received goes to ``Exchange.receive``;
* keeps one link per peer (``Mesh``): a task that connects, streams the batches ``Exchange.flush`` makes for that
  peer every flush interval, and on any failure reconnects with jittered exponential backoff. A link that
  (re)connects is reset in the exchange (the peer may have restarted: it is told everything again). Batches wait in
  a bounded queue per link; when it is full the oldest is dropped and the link reset.

Authentication: with TLS (the ext_proc certificate pair, ``--cert-path``) the server **requires a client
certificate** that chains to that same certificate, and the client verifies the server against it; every replica
mounts the same pair, so only holders of its key can talk to a replica's peer port. Limits: a message over
``wire.MAX_BATCH_BYTES`` is refused by gRPC itself; at most ``MAX_STREAMS`` concurrent streams per server.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass

import grpc
from cryptography import x509

from picker.extproc.tls import CertificatePair
from picker.peers import wire
from picker.peers.exchange import Exchange

__all__ = ["MAX_STREAMS", "PATH", "Mesh", "PeerTls", "add_to_server", "server_credentials"]

log = logging.getLogger(__name__)

SERVICE = "picker.peers.v1.Exchange"
PATH = f"/{SERVICE}/Push"
MAX_STREAMS = 64  # concurrent peer streams a replica serves
_MESSAGE_LIMIT = wire.MAX_BATCH_BYTES + 1024
_CONNECT_TIMEOUT_S = 5.0
_BACKOFF_INITIAL_S, _BACKOFF_MAX_S = 0.2, 10.0
_OPTIONS = [
    ("grpc.max_receive_message_length", _MESSAGE_LIMIT),
    ("grpc.max_send_message_length", _MESSAGE_LIMIT),
    ("grpc.keepalive_time_ms", 10_000),  # notice a dead peer within ~15 s even when nothing is sent
    ("grpc.keepalive_timeout_ms", 5_000),
    ("grpc.keepalive_permit_without_calls", 1),
]
SERVER_OPTIONS = [
    ("grpc.max_receive_message_length", _MESSAGE_LIMIT),
    ("grpc.max_send_message_length", 1024),
    ("grpc.so_reuseport", 0),
    ("grpc.http2.min_ping_interval_without_data_ms", 5_000),
]


@dataclass(frozen=True, slots=True)
class PeerTls:
    """The pool's certificate pair, used as server certificate, client certificate and the only trusted root."""

    pair: CertificatePair

    @property
    def server_name(self) -> str:
        """The name the client checks the server certificate for: its first DNS name (``localhost`` for
        picker's self-signed ones). Peers dial IPs; the shared certificate names none of them."""
        cert = x509.load_pem_x509_certificate(self.pair.cert_pem)
        try:
            san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        except x509.ExtensionNotFound:
            san = None
        names = san.get_values_for_type(x509.DNSName) if san is not None else []
        if names:
            return str(names[0])
        common = cert.subject.get_attributes_for_oid(x509.oid.NameOID.COMMON_NAME)
        return str(common[0].value) if common else "localhost"

    def channel_credentials(self) -> grpc.ChannelCredentials:
        pair = self.pair
        return grpc.ssl_channel_credentials(
            root_certificates=pair.cert_pem, private_key=pair.key_pem, certificate_chain=pair.cert_pem
        )


def server_credentials(tls: PeerTls) -> grpc.ServerCredentials:
    """TLS that requires a client certificate issued by the pool's own certificate."""
    pair = tls.pair
    return grpc.ssl_server_credentials(
        [(pair.key_pem, pair.cert_pem)], root_certificates=pair.cert_pem, require_client_auth=True
    )


def add_to_server(server: grpc.aio.Server, exchange: Exchange, clock: Callable[[], float]) -> None:
    async def push(batches: AsyncIterator[bytes], context: grpc.aio.ServicerContext[bytes, bytes]) -> bytes:
        async for data in batches:
            exchange.receive(data, clock())
        return b""

    handler = grpc.stream_unary_rpc_method_handler(push)  # no (de)serializers: the messages are the bytes
    generic = grpc.method_handlers_generic_handler(SERVICE, {"Push": handler})
    server.add_generic_rpc_handlers((generic,))


class _Link:
    def __init__(self, address: str, queue_batches: int) -> None:
        self.address = address
        self.queue: asyncio.Queue[bytes] = asyncio.Queue(queue_batches)
        self.connected = False
        self.task: asyncio.Task[None] | None = None
        self.failures = 0


class Mesh:
    """This replica's links to its peers, and the flush loop that feeds them."""

    def __init__(
        self,
        exchange: Exchange,
        *,
        tls: PeerTls | None,
        clock: Callable[[], float],
        queue_batches: int = 64,
        rng: random.Random | None = None,
    ) -> None:
        self._exchange = exchange
        self._tls = tls
        self._clock = clock
        self._queue_batches = queue_batches
        self._rng = rng or random.Random()
        self._links: dict[str, _Link] = {}
        self._running = False
        self.dropped_batches = 0

    @property
    def connected(self) -> list[str]:
        return [a for a, link in self._links.items() if link.connected]

    def set_peers(self, addresses: Iterable[str]) -> None:
        """The peers' ``host:port`` addresses (the static list, or the picker Service's current endpoints). Links
        run while ``run`` does; peers set before it starts (or while it restarts) are linked when it does."""
        want = list(dict.fromkeys(addresses))
        for address in [a for a in self._links if a not in want]:
            link = self._links.pop(address)
            if link.task is not None:
                link.task.cancel()
        for address in want:
            self._links.setdefault(address, _Link(address, self._queue_batches))
        self._exchange.set_peers(want)
        if self._running:
            self._start_links()
        log.info("peers: %s", ", ".join(want) or "none")

    def _start_links(self) -> None:
        for link in self._links.values():
            if link.task is None or link.task.done():
                link.connected = False
                link.task = asyncio.create_task(self._run_link(link), name=f"picker-peer-{link.address}")

    async def run(self) -> None:
        """Link every peer and flush every interval, until cancelled; then close every link (a later ``run``
        opens them again)."""
        interval = self._exchange.settings.flush_interval_s
        self._running = True
        self._start_links()
        try:
            while True:
                await asyncio.sleep(interval)
                self.flush()
        finally:
            self._running = False
            tasks = [t for link in self._links.values() if (t := link.task) is not None]
            for task in tasks:
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.gather(*tasks, return_exceptions=True)
            for link in self._links.values():
                link.task = None
                link.connected = False

    def flush(self) -> None:
        for address, batches in self._exchange.flush(self._clock()).items():
            link = self._links.get(address)
            if link is None or not link.connected:
                continue  # the next connection starts from a reset link
            for data in batches:
                if link.queue.full():
                    link.queue.get_nowait()
                    self.dropped_batches += 1
                    self._exchange.reset_peer(address)  # what the dropped batch carried is sent again
                link.queue.put_nowait(data)

    async def _run_link(self, link: _Link) -> None:
        while True:
            try:
                await self._stream(link)
                raise ConnectionError("peer ended the stream")
            except asyncio.CancelledError:
                raise
            except (grpc.aio.AioRpcError, ConnectionError, TimeoutError, OSError) as exc:
                if link.connected or link.failures == 0:
                    log.warning("peer %s: link down: %s", link.address, _reason(exc))
            finally:
                link.connected = False
            link.failures += 1
            await asyncio.sleep(self._backoff(link.failures))

    def _backoff(self, failures: int) -> float:
        """Exponential from 0.2 s to 10 s, jittered into [d/2, d)."""
        delay = min(_BACKOFF_MAX_S, _BACKOFF_INITIAL_S * 2.0 ** min(failures - 1, 30))
        return delay * (0.5 + 0.5 * self._rng.random())

    async def _stream(self, link: _Link) -> None:
        options: list[tuple[str, int | str]] = list(_OPTIONS)
        if self._tls is not None:
            options.append(("grpc.ssl_target_name_override", self._tls.server_name))
            channel = grpc.aio.secure_channel(link.address, self._tls.channel_credentials(), options=options)
        else:
            channel = grpc.aio.insecure_channel(link.address, options=options)
        async with channel:
            await asyncio.wait_for(channel.channel_ready(), _CONNECT_TIMEOUT_S)
            # A fresh queue per connection: batches made for an earlier one are dropped, and the earlier call's
            # request iterator, which gRPC may still be awaiting, can't take this connection's batches.
            link.queue = asyncio.Queue(self._queue_batches)
            self._exchange.reset_peer(link.address)
            link.connected = True
            if link.failures:
                log.info("peer %s: link up", link.address)
            link.failures = 0
            push = channel.stream_unary(PATH)
            await push(_drain(link.queue))  # this connection's queue, bound now


async def _drain(queue: asyncio.Queue[bytes]) -> AsyncIterator[bytes]:
    while True:
        yield await queue.get()


def _reason(exc: BaseException) -> str:
    if isinstance(exc, grpc.aio.AioRpcError):
        return f"{exc.code().name}: {exc.details()}"
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
