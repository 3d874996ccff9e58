"""One replica's end of the peer exchange, wired: what ``picker serve`` starts with ``--peers`` / ``--peer-service``.

``PeerNode.create`` builds the exchange (listening to the configuration's prefix scorers, reading the in-flight
ledger), binds the peer port (mutual TLS with the ext_proc certificate pair, or plaintext when ext_proc is),
and registers the metrics; ``start`` / ``stop`` run the server; ``tasks`` are the background loops for the app's
guarded TaskGroup: the mesh (flushes and links; the static peers) and, with a Service name, the EndpointSlice watch.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

import grpc

from picker import errors
from picker.discovery.kubesettings import KubeSettings
from picker.endpoints.inflight import InflightTracker
from picker.endpoints.model import format_hostport
from picker.endpoints.peerload import PeerLoads
from picker.endpoints.store import EndpointStore
from picker.extproc.tls import CertificatePair
from picker.peers import discovery, metrics, transport
from picker.peers.exchange import Exchange, ExchangeSettings, prefix_scorers
from picker.settings import PeerSettings
from picker.telemetry import REGISTRY

__all__ = ["PeerNode", "Task"]

log = logging.getLogger(__name__)

Task = tuple[str, Callable[[], Awaitable[None]]]


@dataclass
class PeerNode:
    settings: PeerSettings
    exchange: Exchange
    mesh: transport.Mesh
    server: grpc.aio.Server
    port: int  # the bound peer port
    collector: metrics.PeerCollector

    @classmethod
    def create(
        cls,
        settings: PeerSettings,
        *,
        host: str,
        plugins: Mapping[str, object],
        inflight: InflightTracker,
        peer_loads: PeerLoads,
        store: EndpointStore,
        certificate: CertificatePair | None,
        shared_certificate: bool,
        clock: Callable[[], float],
    ) -> PeerNode:
        """Raises ``errors.ConfigError`` when the peer port cannot be bound."""
        exchange = Exchange(
            scorers=prefix_scorers(plugins),
            inflight=inflight,
            peer_loads=peer_loads,
            store=store,
            settings=ExchangeSettings(flush_interval_s=settings.flush_interval_s, state_ttl_s=settings.state_ttl_s),
        )
        tls = transport.PeerTls(certificate) if certificate is not None else None
        if tls is not None and not shared_certificate:
            log.warning("peer exchange with a self-signed certificate: peers must share --cert-path to connect")
        server = grpc.aio.server(options=transport.SERVER_OPTIONS, maximum_concurrent_rpcs=transport.MAX_STREAMS)
        transport.add_to_server(server, exchange, clock)
        address = _address(host, settings.port)
        try:
            port = int(
                server.add_secure_port(address, transport.server_credentials(tls))
                if tls is not None
                else server.add_insecure_port(address)
            )
        except RuntimeError as exc:  # grpc's "Failed to bind"
            exchange.close()
            raise errors.ConfigError(f"cannot listen on {address} (--peer-port): {exc}") from exc
        mesh = transport.Mesh(exchange, tls=tls, clock=clock)
        collector = metrics.register(exchange, mesh, peer_loads, clock)
        return cls(settings, exchange, mesh, server, port, collector)

    async def start(self) -> None:
        await self.server.start()

    async def stop(self) -> None:
        await self.server.stop(0)
        self.exchange.close()
        REGISTRY.unregister(self.collector)

    def tasks(self, *, host: str, kube: KubeSettings | None, clock: Callable[[], float]) -> list[Task]:
        """The mesh (with the static peers, this replica's own addresses left out) and, with ``settings.service``,
        the EndpointSlice watch that sets the peers."""
        peers, mesh = self.settings, self.mesh
        pod_ip = os.environ.get("POD_IP", "")
        own = {
            _address(h, self.port) for h in (host, "127.0.0.1", "localhost", pod_ip) if h and h not in ("0.0.0.0", "::")
        }

        async def run_mesh() -> None:
            if peers.peers:
                mesh.set_peers(p for p in peers.peers if p not in own)
            await mesh.run()

        out: list[Task] = [("peers", run_mesh)]
        if peers.service:
            kube_settings = kube or KubeSettings(pool_namespace=os.environ.get("POD_NAMESPACE", "default"))
            out.append(
                (
                    "peer-discovery",
                    lambda: discovery.watch_service(
                        kube=kube_settings,
                        service=peers.service,
                        port=peers.port,
                        on_peers=mesh.set_peers,
                        exclude=(pod_ip,) if pod_ip else (),
                        clock=clock,
                    ),
                )
            )
        return out


_address = format_hostport  # host:port, an IPv6 address bracketed
