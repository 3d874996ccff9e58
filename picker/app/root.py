"""The composition root: ``serving`` builds picker from its settings (store, scheduler, director, the ext_proc and
health servers, peers, metrics, background tasks) in the caller's event loop and stops it gracefully on exit.

In process (tests, benchmarks)::

    async with serving(settings, store=store) as running:
        ...  # running.grpc_port, running.health_port, running.certificate, running.director, ...
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import grpc
from aiohttp import web

from picker import __version__, admission, errors
from picker.app import listen
from picker.app.metrics_http import metrics_authorizer, start_metrics
from picker.app.precise import precise_path
from picker.app.supervise import supervise
from picker.control.director import Admitter, Director, Resolver
from picker.control.policy_resolver import PolicyResolver
from picker.discovery import kubesettings, static
from picker.endpoints.inflight import InflightTracker
from picker.endpoints.model import EndpointSnapshot
from picker.endpoints.peerload import PeerLoads
from picker.endpoints.policy import PolicyStore
from picker.endpoints.store import EndpointStore
from picker.extproc import health, native, servicer, tls
from picker.extproc.stream import StreamEnv
from picker.kvevents import KVEventSubscriber
from picker.peers import transport
from picker.peers.exchange import Exchange
from picker.peers.node import PeerNode
from picker.scheduling.config import SchedulerConfig, load_config, load_config_file
from picker.scheduling.framework import PluginContext
from picker.scheduling.scheduler import Scheduler
from picker.scrape import poller
from picker.scrape.share import ScrapeShare
from picker.settings import ScrapeSettings, Settings
from picker.telemetry import REGISTRY, kvmetrics, runtime, tracing
from picker.telemetry import metrics as m

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider

    from picker.discovery.leaderelection import LeaderElector

__all__ = ["STATIC_POOL_NAME", "Running", "serving"]

STATIC_POOL_NAME = "static"  # the ``name`` label of inference_pool_* gauges without an InferencePool
_EXPIRY_INTERVAL_S = 1.0
_MESSAGE_SLACK_BYTES = 1 << 20  # room for the protobuf framing around a maximal body


@dataclass
class Running:
    """A started picker: what tests and benchmarks need to talk to it."""

    settings: Settings
    store: EndpointStore
    inflight: InflightTracker
    scheduler: Scheduler
    director: Director
    health: health.HealthServicer
    extproc: servicer.ExtProcServicer | native.NativeExtProc
    grpc_port: int
    health_port: int
    metrics_port: int | None  # None: the metrics HTTP server is off
    certificate: tls.CertificatePair | None  # None: plaintext; with cert reload, the pair served at start
    cert_files: tls.CertificateFiles | None = None  # --cert-path with reload: the pair in use, reload count
    supervisor: asyncio.Task[None] | None = None  # runs the background TaskGroup
    elector: LeaderElector | None = None  # with leader election
    kv_events: KVEventSubscriber | None = None  # with a precise-prefix-cache-scorer
    exchange: Exchange | None = None  # with peers (--peers, --peer-service)
    mesh: transport.Mesh | None = None
    peer_port: int | None = None

    @property
    def grpc_target(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    async def begin_shutdown(self) -> None:
        """Health NOT_SERVING for good and, when leading, release the Lease so a standby takes over now.

        Streams are still accepted; ``serving``'s exit refuses new ones and drains. Idempotent.
        """
        self.health.drain()
        if self.elector is not None:
            await self.elector.resign(timeout_s=self.settings.server.grace_period_s or 1.0)


@contextlib.asynccontextmanager
async def serving(
    settings: Settings,
    *,
    store: EndpointStore | None = None,
    clock: Callable[[], float] = time.monotonic,
    config: SchedulerConfig | None = None,
    resolver: Resolver | None = None,
    admitter: Admitter | None = None,
    scrape: bool = True,
    pool_name: str = STATIC_POOL_NAME,
    kube: kubesettings.KubeSettings | None = None,
    policies: PolicyStore | None = None,
    tracer_provider: TracerProvider | None = None,
) -> AsyncIterator[Running]:
    """Start picker in this event loop; stop it (gracefully) on exit.

    ``store``: an endpoint store to serve from (tests set its endpoints and metrics directly); by default a new
    one with ``settings.static_endpoints`` published. ``scrape=False`` runs no metrics poller. Ports of 0 for
    gRPC and health bind ephemeral ports (read them from the result); a metrics port of 0 disables /metrics.
    ``kube``: discover endpoints, objectives and rewrites from Kubernetes (``policies`` receives the latter); with
    ``kube.leader_election`` campaign for the pool's Lease, and report ready only while leading.
    ``tracer_provider``: trace with this provider; by default one from the OTEL_* environment when
    ``settings.server.tracing`` is on (stopped, spans flushed, on exit), else no tracing.
    """
    server_settings = settings.server
    # First: a bad certificate or CA file fails the start before the tracer, KV-event sockets or ports open.
    certificate, cert_files, credentials = listen.ext_proc_tls(server_settings)
    own_provider = tracer_provider is None and server_settings.tracing
    if own_provider:
        try:
            tracer_provider = tracing.start()
        except ValueError as exc:
            raise errors.ConfigError(str(exc)) from exc
    tracer = tracer_provider.get_tracer("picker", __version__) if tracer_provider is not None else None
    store = store if store is not None else EndpointStore()
    if settings.static_endpoints:
        static.publish_static(store, settings.static_endpoints)
    policies = policies if policies is not None else PolicyStore()
    if resolver is None and kube is not None:
        resolver = PolicyResolver(policies)
    inflight = InflightTracker()
    peer_settings = settings.peers
    peer_loads = PeerLoads(peer_settings.state_ttl_s) if peer_settings.enabled else None
    ctx = PluginContext(clock=clock, inflight=inflight, metrics_max_age_s=settings.scrape.staleness_s, peers=peer_loads)
    if config is None:
        if settings.config_file:
            config = load_config_file(settings.config_file, ctx)
        else:
            config = load_config(settings.config_text, ctx)
    scheduler = Scheduler(config, ctx, prefilter_k=settings.prefilter_endpoints)
    precise = precise_path(config)
    director = Director(
        store=store,
        scheduler=scheduler,
        inflight=inflight,
        clock=clock,
        settings=server_settings,
        resolver=resolver,
        tracer=tracer,
        # Default admission from the config: flow control (featureGates: [flowControl]) or shedding.
        admitter=admitter
        if admitter is not None
        else admission.build_admitter(
            config, ctx, store=store, shed_status=server_settings.shed_status, pool_name=pool_name
        ),
        tokens=precise.tokens if precise is not None else None,
    )
    env = StreamEnv(director=director, settings=server_settings, parser=config.parser)
    health_servicer = health.HealthServicer()
    if kube is not None and kube.leader_election:
        health_servicer.require_leader()  # before the health port opens: a standby is never ready, not even once
    _follow_store(store, health_servicer, inflight, scheduler)

    max_message = max(server_settings.max_body_bytes, server_settings.max_response_buffer_bytes)
    address = listen.address(server_settings.host, server_settings.grpc_port)
    grpc_server: grpc.aio.Server | None = None
    front: native.NativeExtProc | None = None
    extproc: servicer.ExtProcServicer | native.NativeExtProc
    if listen.native_frontend(server_settings):
        try:
            front = native.NativeExtProc(
                env,
                server_settings.host,
                server_settings.grpc_port,
                reuse_port=server_settings.reuse_port,
                max_message=max_message + _MESSAGE_SLACK_BYTES,
                # Health on the ext_proc port too (see below)
                health_servicer=health_servicer if server_settings.health_checking else None,
                cert_pem=certificate.cert_pem if certificate is not None else None,
                key_pem=certificate.key_pem if certificate is not None else None,
                client_ca_pem=cert_files.client_ca
                if cert_files is not None
                else tls.load_client_ca(server_settings.client_ca_file)
                if certificate is not None and server_settings.client_ca_file
                else None,
                reload=cert_files.fetch_pem if cert_files is not None else None,
            )
        except OSError as exc:
            raise errors.ConfigError(f"cannot listen on {address}: {exc}") from exc
        extproc = front
        grpc_port = front.port
    else:
        extproc = servicer.ExtProcServicer(env)
        grpc_server = grpc.aio.server(
            options=[
                ("grpc.max_receive_message_length", max_message + _MESSAGE_SLACK_BYTES),
                ("grpc.max_send_message_length", max_message + _MESSAGE_SLACK_BYTES),
                # a second picker on the same port must fail, not share it; --workers share it on purpose
                ("grpc.so_reuseport", int(server_settings.reuse_port)),
            ]
        )
        servicer.add_to_server(extproc, grpc_server)
        # Health on the ext_proc port too (TLS as the port; the reference's --health-checking, on by default
        # here): a gateway can health-check the very port it calls, as the reference's test Envoy config does;
        # the plaintext health port stays for kubelet probes.
        if server_settings.health_checking:
            health.add_to_server(health_servicer, grpc_server)
        grpc_port = listen.bind(grpc_server, address, credentials)
    health_server = grpc.aio.server(options=[("grpc.so_reuseport", int(server_settings.reuse_port))])
    health.add_to_server(health_servicer, health_server)
    health_port = listen.bind(health_server, listen.address(server_settings.host, server_settings.health_port), None)
    peer_node: PeerNode | None = None
    if peer_loads is not None:
        peer_node = PeerNode.create(
            peer_settings,
            host=peer_settings.bind_host or server_settings.host,
            plugins=config.plugins,
            inflight=inflight,
            peer_loads=peer_loads,
            store=store,
            certificate=certificate,
            shared_certificate=bool(server_settings.cert_path),
            clock=clock,
        )

    collector = m.register_pool_collector(lambda: pool_name, lambda: _pod_stats(store.current()))
    kv_collector = kvmetrics.register_kv_collector(precise.sample) if precise is not None else None
    runtime_source = runtime.add_source(
        runtime.Source(asyncio.get_running_loop(), leases=lambda: inflight.open_leases, streams=lambda: extproc.active)
    )
    m.INFO.labels(os.environ.get("PICKER_COMMIT", ""), __version__).set(1)
    metrics_runner: web.AppRunner | None = None
    running: Running | None = None
    try:
        await health_server.start()
        if peer_node is not None:
            await peer_node.start()
        metrics_runner = await start_metrics(
            server_settings.metrics_host or server_settings.host,
            server_settings.metrics_port,
            *metrics_authorizer(server_settings, kube),
            pprof_routes=server_settings.enable_pprof,
        )
        if front is not None:
            front.start()
        else:
            assert grpc_server is not None
            await grpc_server.start()
        running = Running(
            settings=settings,
            store=store,
            inflight=inflight,
            scheduler=scheduler,
            director=director,
            health=health_servicer,
            extproc=extproc,
            grpc_port=grpc_port,
            health_port=health_port,
            metrics_port=server_settings.metrics_port or None,
            certificate=certificate,
            kv_events=precise.subscriber if precise is not None else None,
            cert_files=cert_files,
            exchange=peer_node.exchange if peer_node else None,
            mesh=peer_node.mesh if peer_node else None,
            peer_port=peer_node.port if peer_node else None,
        )
        background: list[tuple[str, Callable[[], Awaitable[None]]]] = [
            ("inflight-expiry", lambda: director.run_expiry(interval_s=_EXPIRY_INTERVAL_S)),
        ]
        if server_settings.hung_server_detection:
            background.append(("hung-check", director.run_hung_check))
        if precise is not None:
            subscriber = precise.subscriber
            background.append(("kv-events", lambda: subscriber.run(store=store)))
        if scrape:
            share = _scrape_share(settings.scrape, peer_node.exchange if peer_node else None)
            background.append(
                (
                    "scrape",
                    lambda: poller.run(
                        store=store,
                        settings=settings.scrape,
                        clock=clock,
                        own_requests=ctx.ledger_requests,
                        share=share,
                    ),
                )
            )
        if kube is not None:
            from picker.discovery import kubernetes as kube_discovery  # imports kubernetes-asyncio

            background.append(
                (
                    "kubernetes",
                    lambda: kube_discovery.run(store=store, policy_store=policies, settings=kube, clock=clock),
                )
            )
        if peer_node is not None:
            background += peer_node.tasks(host=peer_settings.bind_host or server_settings.host, kube=kube, clock=clock)
        if kube is not None and kube.leader_election:
            from picker.discovery import leaderelection

            elector = running.elector = leaderelection.elector_for(kube, on_change=health_servicer.set_leader)
            background.append(("leader-election", lambda: leaderelection.campaign(elector, kube)))
        # The background TaskGroup runs in a supervisor task, so an exception in the caller's ``async with``
        # body propagates as itself (not wrapped in an ExceptionGroup) and the guards keep crashes out of it.
        running.supervisor = asyncio.create_task(supervise(background), name="picker-background")
        try:
            yield running
        finally:
            await running.begin_shutdown()
            # Refuse new streams; give in-flight ones the termination grace to finish.
            if front is not None:
                await front.stop(server_settings.termination_grace_s)
            elif grpc_server is not None:
                await grpc_server.stop(server_settings.termination_grace_s)
            running.supervisor.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await running.supervisor
    finally:
        health_servicer.drain()
        if front is not None:
            await front.stop(0)
        elif grpc_server is not None:
            await grpc_server.stop(0)
        await health_server.stop(0)
        if peer_node is not None:
            await peer_node.stop()
        if metrics_runner is not None:
            await metrics_runner.cleanup()
        REGISTRY.unregister(collector)
        if precise is not None:
            await precise.close()
        if kv_collector is not None:
            REGISTRY.unregister(kv_collector)
        if own_provider and tracer_provider is not None:  # flushing queued spans blocks: not on the loop
            await asyncio.get_running_loop().run_in_executor(None, tracing.stop, tracer_provider)
        runtime.remove_source(runtime_source)


def _scrape_share(scrape: ScrapeSettings, exchange: Exchange | None) -> ScrapeShare | None:
    """A worker's share of the pod's polls (``--workers``), over the workers' exchange; None: poll every server."""
    if scrape.share_count <= 1 or exchange is None:
        return None
    # The owner's outcomes arrive every interval (a poll that hangs reports its timeout): two intervals and a
    # timeout of silence mean it is not polling, and the others poll its servers until it is back. Sooner if the
    # staleness threshold is shorter, so a dead worker's servers are polled again before they would go stale.
    interval = scrape.interval_s
    takeover_s = max(3 * interval, min(2 * interval + scrape.timeout_s, scrape.staleness_s / 2))
    share = ScrapeShare(scrape.share_index, scrape.share_count, takeover_s=takeover_s)
    share.publish = exchange.publish_scrapes
    exchange.on_scrapes = share.receive
    return share


def _follow_store(
    store: EndpointStore, health_servicer: health.HealthServicer, inflight: InflightTracker, scheduler: Scheduler
) -> None:
    """Health follows the sync state; in-flight and plugin state of endpoints that left the pool is dropped."""
    keys: frozenset[str] = frozenset()

    def on_snapshot(snap: EndpointSnapshot) -> None:
        nonlocal keys
        health_servicer.set_ready(snap.synced)
        current = frozenset(e.key for e in snap.endpoints)
        if current != keys:
            keys = current
            inflight.forget_except(current)
            scheduler.endpoints_changed(current)

    store.subscribe(on_snapshot)
    on_snapshot(store.current())


def _pod_stats(snap: EndpointSnapshot) -> Sequence[m.PodStats]:
    return [
        m.PodStats(
            name=e.name,
            waiting=e.metrics.waiting,
            running=e.metrics.running,
            kv_usage=e.metrics.kv_usage,
            ready=not e.excluded,
        )
        for e in snap.endpoints
    ]
