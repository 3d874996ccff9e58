"""Composition root and ``picker serve``: wiring, background tasks, the gRPC servers, graceful stop.

In process (tests, benchmarks)::

    async with serving(settings, store=store) as running:
        ...  # running.grpc_port, running.health_port, running.certificate, running.director, ...

As a process: ``picker serve --endpoints 10.0.0.1:8000,10.0.0.2:8000 [flags]`` (flags as the reference EPP's,
plus picker's; ``picker serve --help``; ``picker.serve`` runs this once, or N times with ``--workers``).
SIGTERM: health turns NOT_SERVING at once, new streams are still accepted for ``grace_period_s`` (so gateways see
the health change first), then refused; in-flight streams get up to ``termination_grace_s`` to finish; exit 0. With
``--ha-enable-leader-election`` only the holder of the pool's Lease reports ready; on SIGTERM the leader releases
the Lease at once (with the health change), so a standby takes over while the old leader is still draining.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import gc
import logging
import os
import signal
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import grpc
import zmq
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from picker import __version__, admission, compat, errors
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
from picker.kvcache.ingest import Ingestor
from picker.kvevents import KVEventSubscriber, ServerTokenSource, SubscriberSettings
from picker.peers import discovery as peer_discovery
from picker.peers import transport
from picker.peers.exchange import Exchange
from picker.peers.node import PeerNode
from picker.scheduling import units
from picker.scheduling.config import SchedulerConfig, load_config, load_config_file
from picker.scheduling.framework import PluginContext
from picker.scheduling.plugins import precise_prefix, token_producer
from picker.scheduling.scheduler import Scheduler
from picker.scheduling.units import add_bool_flag, port_arg
from picker.scheduling.units import duration_arg as parse_duration
from picker.scrape import poller
from picker.scrape.share import ScrapeShare
from picker.settings import PeerSettings, ScrapeSettings, ServerSettings, Settings
from picker.telemetry import REGISTRY, kvmetrics, logs, metricsauth, pprof, runtime, tracing
from picker.telemetry import metrics as m

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider

    from picker.discovery.leaderelection import LeaderElector

__all__ = [
    "Running",
    "configure",
    "load",
    "metrics_authorizer",
    "parse_duration",
    "run_settings",
    "serve",
    "serving",
    "settings_from_args",
    "start_metrics",
]

log = logging.getLogger("picker")

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


def configure(parser: argparse.ArgumentParser) -> None:
    """``picker serve`` flags: the reference EPP's names (and defaults) where it has them, then picker's."""
    srv, scr = ServerSettings(), ScrapeSettings()
    add = parser.add_argument
    add("--grpc-port", type=port_arg, default=srv.grpc_port, help="ext_proc gRPC port (0: any free port)")
    add("--grpc-health-port", type=port_arg, default=srv.health_port, help="gRPC health port (plaintext)")
    add("--metrics-port", type=port_arg, default=srv.metrics_port, help="Prometheus /metrics port (0: off)")
    add("--host", default=srv.host, help="address to listen on")
    add_bool_flag(
        parser,
        "--secure-serving",
        default=srv.secure_serving,
        help="TLS on the ext_proc port (default true; --secure-serving=false for plaintext)",
    )
    add("--cert-path", default=None, help="directory with tls.crt and tls.key (default: self-signed at start)")
    add_bool_flag(
        parser,
        "--enable-cert-reload",
        default=srv.cert_reload,
        help="serve a rotated --cert-path pair (and --client-ca-file) from the next handshake on, no restart",
    )
    add("--client-ca-file", default=None, help="PEM CA bundle: require gateway client certificates it signed (mTLS)")
    add_bool_flag(
        parser,
        "--metrics-endpoint-auth",
        default=srv.metrics_endpoint_auth,
        help="/metrics needs a bearer token the Kubernetes API accepts (TokenReview) for GET /metrics",
    )
    add("--metrics-auth-token-file", default=None, help="/metrics needs 'Authorization: Bearer <this file's token>'")
    add("--config-file", default=None, help="EndpointPickerConfig YAML file")
    add("--config-text", default=None, help="EndpointPickerConfig YAML text")
    add("--endpoints", default=None, help="static model servers: ip:port[@metrics-url][;engine=E][;name=N],...")
    add("--endpoints-file", default=None, help="static model servers from a YAML/JSON file")
    add(
        "--refresh-metrics-interval",
        type=parse_duration,
        default=scr.interval_s,
        metavar="DURATION",
        help="model-server metrics poll interval (e.g. 50ms, 0.1s)",
    )
    add(
        "--metrics-staleness-threshold",
        type=parse_duration,
        default=scr.staleness_s,
        metavar="DURATION",
        help="metrics older than this exclude an endpoint (e.g. 2s)",
    )
    add_bool_flag(parser, "--disable-endpoint-subset-filter", default=False, help="ignore the proxy's subset hint")
    add("--max-body-bytes", type=units.at_least(1), default=srv.max_body_bytes, help="request bodies over this get 413")
    add(
        "--max-header-bytes",
        type=units.at_least(1),
        default=srv.max_header_bytes,
        help="request headers over this get 431",
    )
    add(
        "--retry-after",
        type=units.at_least(0),
        default=srv.retry_after_s,
        metavar="SECONDS",
        help="add Retry-After: SECONDS to 429 and 503 answers (0: none)",
    )
    add(
        "--gateway-profile",
        choices=("auto", "envoy", "nginx", "agentgateway"),
        default=srv.gateway_profile,
        help="the gateway's ext_proc dialect; auto tells Envoy from the NGINX Gateway Fabric shim by itself",
    )
    add(
        "--workers",
        type=int,
        default=0,
        metavar="N",
        help="serve with N processes on the same ports, sharing in-flight and prefix state over the peer "
        "exchange (0: as many as the container's CPU limit allows, 1 without a limit; picker/serve.py)",
    )
    add(
        "--prefilter-endpoints",
        type=units.at_least(0),
        default=Settings().prefilter_endpoints,
        help="pools larger than this score only this many least loaded endpoints plus the prefix holders (0: off)",
    )
    add_bool_flag(
        parser,
        "--explain-header",
        default=False,
        help="add x-picker-explain (per-plugin scores, compact JSON) to the routed request",
    )
    add(
        "--shed-status",
        type=int,
        choices=(429, 503),
        default=srv.shed_status,
        help="HTTP status of a shed request (the reference code says 429, its docs 503)",
    )
    add(
        "--inflight-timeout",
        type=parse_duration,
        default=srv.inflight_timeout_s,
        metavar="DURATION",
        help="gateways that report no response: release its in-flight count after its expected duration, at most this",
    )
    add(
        "--grace-period",
        type=parse_duration,
        default=srv.grace_period_s,
        metavar="DURATION",
        help="SIGTERM: keep accepting streams this long after health turns NOT_SERVING",
    )
    add(
        "--termination-grace",
        type=parse_duration,
        default=srv.termination_grace_s,
        metavar="DURATION",
        help="SIGTERM: wait at most this long for in-flight streams",
    )
    add(
        "--grpc-frontend",
        choices=("auto", "native", "grpc"),
        default=srv.grpc_frontend,
        help="the ext_proc port's HTTP/2, TLS and gRPC: native (Rust, off the GIL), grpc (grpc.aio), auto (native "
        "when it is built)",
    )
    add("--v", type=int, default=None, help="verbosity as the reference (4: debug)")
    add("--log-level", choices=("debug", "info", "warning", "error"), default=None, help="log level (wins over --v)")
    add("--zap-encoder", choices=("json", "console"), default="json", help="log format")
    peer = PeerSettings()
    add(
        "--peers",
        default="",
        metavar="HOST:PORT,...",
        help="active-active: the other picker replicas' peer addresses (docs/ha.md); port default --peer-port",
    )
    add(
        "--peer-service",
        default="",
        metavar="NAME",
        help="active-active: find the replicas in this Service's EndpointSlices",
    )
    add(
        "--peer-port",
        type=port_arg,
        default=peer.port,
        help="peer exchange port (mutual TLS with the --cert-path pair)",
    )
    add(
        "--peer-flush-interval",
        type=parse_duration,
        default=None,
        metavar="DURATION",
        help=f"how often placements and in-flight counts go to the peers (default {peer.flush_interval_s * 1000:g}ms; "
        "between --workers of one pod 5ms: batching saves CPU per request)",
    )
    add(
        "--peer-state-ttl",
        type=parse_duration,
        default=peer.state_ttl_s,
        metavar="DURATION",
        help="a peer silent this long no longer counts",
    )
    kubesettings.configure(parser)
    compat.configure(parser, parse_duration)


def settings_from_args(args: argparse.Namespace) -> Settings:
    """Flags → Settings. Raises ``errors.ConfigError`` for bad endpoint lists."""
    endpoints = static.parse_endpoints(args.endpoints) if args.endpoints else ()
    if args.endpoints_file:
        endpoints = (*endpoints, *static.load_endpoints_file(args.endpoints_file))
    reference = compat.options_from_args(args)
    if args.log_level:
        level = args.log_level
    elif reference.log_level is not None:
        level = reference.log_level
    elif args.v is not None:
        level = logging.getLevelName(logs.level_from_verbosity(args.v)).lower()
    else:
        level = "info"
    base = Settings()
    return Settings(
        server=dataclasses.replace(
            base.server,
            host=args.host,
            grpc_port=args.grpc_port,
            health_port=args.grpc_health_port,
            metrics_port=args.metrics_port,
            secure_serving=args.secure_serving,
            cert_path=args.cert_path,
            cert_reload=args.enable_cert_reload,
            client_ca_file=args.client_ca_file,
            metrics_endpoint_auth=args.metrics_endpoint_auth,
            metrics_auth_token_file=args.metrics_auth_token_file,
            max_body_bytes=args.max_body_bytes,
            max_header_bytes=args.max_header_bytes,
            retry_after_s=args.retry_after,
            gateway_profile=args.gateway_profile,
            disable_subset_filter=args.disable_endpoint_subset_filter,
            explain_header=args.explain_header,
            shed_status=args.shed_status,
            inflight_timeout_s=args.inflight_timeout,
            grace_period_s=args.grace_period,
            termination_grace_s=args.termination_grace,
            tracing=reference.tracing,
            enable_pprof=reference.enable_pprof,
            health_checking=reference.health_checking,
            grpc_frontend=args.grpc_frontend,
        ),
        scrape=dataclasses.replace(
            base.scrape, interval_s=args.refresh_metrics_interval, staleness_s=args.metrics_staleness_threshold
        ),
        peers=_peer_settings(args),
        static_endpoints=endpoints,
        config_file=args.config_file,
        config_text=args.config_text,
        log_level=level,
        log_format="text" if args.zap_encoder == "console" else "json",
        prefilter_endpoints=args.prefilter_endpoints,
    )


def _peer_settings(args: argparse.Namespace) -> PeerSettings:
    try:
        peers = peer_discovery.parse_peers(args.peers, args.peer_port) if args.peers else ()
    except ValueError as exc:
        raise errors.ConfigError(f"--peers: {exc}") from exc
    if args.peer_service and args.peer_port == 0:
        raise errors.ConfigError("--peer-service needs a fixed --peer-port: the peers are dialled at it")
    flush_s = args.peer_flush_interval if args.peer_flush_interval is not None else PeerSettings().flush_interval_s
    if flush_s <= 0 or args.peer_state_ttl <= 0:
        raise errors.ConfigError("--peer-flush-interval and --peer-state-ttl must be positive")
    return PeerSettings(
        peers=peers,
        service=args.peer_service,
        port=args.peer_port,
        flush_interval_s=flush_s,
        state_ttl_s=args.peer_state_ttl,
    )


def load(args: argparse.Namespace) -> tuple[Settings, kubesettings.KubeSettings | None]:
    """Flags → (Settings, KubeSettings or None). Raises ``errors.ConfigError``."""
    settings = settings_from_args(args)
    kube = kubesettings.settings_from_args(args)
    if kube is not None and settings.static_endpoints:
        raise errors.ConfigError("give --endpoints/--endpoints-file or --pool-name/--endpoint-selector, not both")
    return settings, kube


def run_settings(settings: Settings, kube: kubesettings.KubeSettings | None) -> int:
    """Serve until SIGTERM in a new event loop (uvloop's when installed). Logging must be configured."""
    try:
        with asyncio.Runner(loop_factory=_loop_factory()) as runner:
            return runner.run(serve(settings, kube=kube))
    except errors.ConfigError as exc:
        log.error("configuration error: %s", exc)
        return 2


def _freeze_startup_heap() -> None:
    """Move what start-up made (modules, configuration, the servers: ~80,000 objects) out of the collector's
    reach. Every full collection walked them all, a ~50 ms pause of every request in flight, a few times a
    minute under load (docs/performance.md); they live as long as the process, so there is nothing to find."""
    gc.collect()
    gc.freeze()


def _loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's loop when it is installed (optional; not a dependency), else asyncio's default."""
    try:
        import uvloop  # type: ignore[import-not-found, unused-ignore]
    except ImportError:
        return None
    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return factory


async def serve(settings: Settings, *, kube: kubesettings.KubeSettings | None = None) -> int:
    """Run until SIGTERM/SIGINT, then drain and stop. Returns the exit code."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    pool_name = kube.pool_name if kube is not None and kube.pool_name else STATIC_POOL_NAME
    async with serving(settings, kube=kube, pool_name=pool_name) as running:
        _freeze_startup_heap()
        log.info(
            "picker serving",
            extra={
                "grpc_port": running.grpc_port,
                "health_port": running.health_port,
                "metrics_port": running.metrics_port,
                "tls": running.certificate is not None,
                "endpoints": len(running.store.current()),
            },
        )
        await stop.wait()
        stop.clear()
        log.info("shutting down: health NOT_SERVING, draining", extra={"grace_s": settings.server.grace_period_s})
        await running.begin_shutdown()
        # Keep accepting streams a moment so gateways notice the health change before connections are refused;
        # a second signal skips the wait.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), settings.server.grace_period_s)
    log.info("picker stopped")
    return 0


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
    certificate, cert_files, credentials = _tls(server_settings)
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
    precise = _precise_path(config)
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
    address = _address(server_settings.host, server_settings.grpc_port)
    grpc_server: grpc.aio.Server | None = None
    front: native.NativeExtProc | None = None
    extproc: servicer.ExtProcServicer | native.NativeExtProc
    if _native_frontend(server_settings):
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
        grpc_port = _bind(grpc_server, address, credentials)
    health_server = grpc.aio.server(options=[("grpc.so_reuseport", int(server_settings.reuse_port))])
    health.add_to_server(health_servicer, health_server)
    health_port = _bind(health_server, _address(server_settings.host, server_settings.health_port), None)
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
            ("hung-check", director.run_hung_check),
        ]
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
        running.supervisor = asyncio.create_task(_supervise(background), name="picker-background")
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


@dataclass
class _PrecisePath:
    """What a configured ``precise-prefix-cache-scorer`` needs at run time: the KV-event subscriber feeding its
    index and the token source looking up the prompt's ids before scheduling."""

    subscriber: KVEventSubscriber
    ingestor: Ingestor
    tokens: ServerTokenSource

    def sample(self) -> kvmetrics.KVSample:
        st = self.ingestor.stats
        index = self.ingestor.indexes[0]
        return kvmetrics.KVSample(
            messages={
                "applied": st.applied,
                "duplicate": st.duplicates,
                "unknown_endpoint": st.unknown_endpoint,
                "malformed": st.malformed.total(),
                "replayed": st.replayed,
            },
            malformed=dict(st.malformed),
            resyncs=dict(st.resyncs),
            events=st.events,
            gaps=st.gaps,
            missed_batches=st.missed_batches,
            restarts=st.restarts,
            index_entries=index.entries,
            index_keys=index.keys,
            index=index.stats.as_dict(),
        )

    async def close(self) -> None:
        self.subscriber.terminate()
        await self.tokens.close()


def _precise_path(config: SchedulerConfig) -> _PrecisePath | None:
    """The subscriber and token source of the config's precise scorers (one subscriber feeds them all; the first
    scorer's ``kvEventsConfig`` sets it up). Binding in central mode happens here: a busy port fails the start."""
    scorers = [p for p in config.plugins.values() if isinstance(p, precise_prefix.PrecisePrefixCacheScorer)]
    if not scorers:
        return None
    producers = config.configured(token_producer.KIND)
    params = producers[0].params if producers else token_producer.Params()
    assert isinstance(params, token_producer.Params)
    tokens = ServerTokenSource(params)  # first: a bad localTokenizer is a ConfigError before any socket opens
    events = scorers[0].params.kv_events_config
    ingestor = Ingestor([s.index for s in scorers])
    subscriber = KVEventSubscriber(
        ingestor,
        SubscriberSettings(
            topic_filter=events.topic_filter,
            discover=events.discover_pods,
            socket_port=events.pod_discovery_config.socket_port,
            replay_port=events.pod_discovery_config.replay_socket_port,
            bind=events.zmq_endpoint,
            queue_size=events.queue_size,
        ),
    )
    try:
        subscriber.start()
    except zmq.ZMQError as exc:
        subscriber.terminate()
        raise errors.ConfigError(f"kv events: cannot bind {events.zmq_endpoint!r}: {exc}") from exc
    return _PrecisePath(subscriber, ingestor, tokens)


def _tls(
    srv: ServerSettings,
) -> tuple[tls.CertificatePair | None, tls.CertificateFiles | None, grpc.ServerCredentials | None]:
    """The ext_proc port's credentials: none (plaintext), files (reloaded on change) or a self-signed pair."""
    if not srv.secure_serving:
        if srv.client_ca_file:
            raise errors.ConfigError("--client-ca-file needs --secure-serving")
        return None, None, None
    if srv.cert_path and srv.cert_reload:
        files = tls.CertificateFiles(srv.cert_path, srv.client_ca_file)
        return files.pair, files, files.credentials()
    # ECDSA P-256, not the reference's RSA-4096: see tls.py
    pair = tls.load_pair(srv.cert_path) if srv.cert_path else tls.self_signed((srv.host, os.environ.get("POD_IP", "")))
    client_ca = tls.load_client_ca(srv.client_ca_file) if srv.client_ca_file else None
    return pair, None, tls.server_credentials(pair, client_ca)


def _native_frontend(srv: ServerSettings) -> bool:
    """Serve ext_proc on the native front (``--grpc-frontend``)?"""
    if srv.grpc_frontend == "grpc":
        return False
    if native.AVAILABLE:
        return True
    reason = "picker.extproc._front is not built (scripts/install.sh builds it when cargo is there)"
    if srv.grpc_frontend == "native":
        raise errors.ConfigError(f"--grpc-frontend=native: {reason}")
    log.info("ext_proc served by grpc.aio", extra={"reason": reason})
    return False


def _bind(server: grpc.aio.Server, address: str, credentials: grpc.ServerCredentials | None) -> int:
    try:
        if credentials is None:
            return int(server.add_insecure_port(address))
        return int(server.add_secure_port(address, credentials))
    except RuntimeError as exc:  # grpc's "Failed to bind"
        raise errors.ConfigError(f"cannot listen on {address}: {exc}") from exc


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


def _address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


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


async def _supervise(tasks: Sequence[tuple[str, Callable[[], Awaitable[None]]]]) -> None:
    """Run every background task, each behind a guard, in one TaskGroup until cancelled."""
    async with asyncio.TaskGroup() as tg:
        for name, start in tasks:
            tg.create_task(_guard(name, start), name=f"picker-{name}")


async def _guard(name: str, start: Callable[[], Awaitable[None]]) -> None:
    """Run a background task; log a crash or an early return and restart it with backoff. Never raises."""
    backoff_s = 1.0
    while True:
        began = time.monotonic()
        try:
            await start()
            log.error("background task returned early; restarting", extra={"task": name})
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("background task crashed; restarting", extra={"task": name})
        if time.monotonic() - began > 60.0:
            backoff_s = 1.0  # it ran a good while: a fresh failure, not a crash loop
        await asyncio.sleep(backoff_s)
        backoff_s = min(backoff_s * 2, 30.0)


MetricsAuthorizer = Callable[[str | None], Awaitable[metricsauth.Verdict]]
_Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def metrics_authorizer(
    srv: ServerSettings, kube: kubesettings.KubeSettings | None
) -> tuple[MetricsAuthorizer | None, Callable[[], Awaitable[None]] | None]:
    """``--metrics-auth-token-file`` (a static token) or ``--metrics-endpoint-auth`` (Kubernetes TokenReview),
    and what closes it."""
    if srv.metrics_auth_token_file and srv.metrics_endpoint_auth:
        raise errors.ConfigError("give --metrics-auth-token-file or --metrics-endpoint-auth, not both")
    if srv.metrics_auth_token_file:
        token = metricsauth.StaticToken(srv.metrics_auth_token_file)

        async def static_verdict(authorization: str | None) -> metricsauth.Verdict:
            return token.verdict(authorization)

        return static_verdict, None
    if srv.metrics_endpoint_auth:
        from picker.discovery import tokenreview  # imports kubernetes-asyncio

        reviewer = tokenreview.Reviewer(kube or kubesettings.KubeSettings())
        return reviewer.verdict, reviewer.close
    return None, None


async def start_metrics(
    host: str,
    port: int,
    authorize: MetricsAuthorizer | None = None,
    close: Callable[[], Awaitable[None]] | None = None,
    *,
    pprof_routes: bool = False,
    render: Callable[[], Awaitable[bytes]] | None = None,
) -> web.AppRunner | None:
    """``GET /metrics`` (picker's registry). Exposition runs in a thread so a scrape never stalls streams.
    ``render``: the page to serve instead (the ``--workers`` supervisor's merge of its workers' pages).

    With ``authorize`` every request must pass it: 401 (with ``WWW-Authenticate: Bearer``) or 403 otherwise.
    ``pprof_routes``: also ``/debug/pprof/`` (``--enable-pprof``, telemetry/pprof.py), behind the same check."""
    if not port:
        return None

    async def own_page() -> bytes:
        return await asyncio.get_running_loop().run_in_executor(None, generate_latest, REGISTRY)

    page = render or own_page

    async def metrics(_: web.Request) -> web.Response:
        body = await page()
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    middlewares = []
    if authorize is not None:
        check = authorize

        @web.middleware
        async def authorized(request: web.Request, handler: _Handler) -> web.StreamResponse:
            verdict = await check(request.headers.get("Authorization"))
            if verdict is metricsauth.Verdict.UNAUTHENTICATED:
                return web.Response(status=401, text="Unauthorized\n", headers={"WWW-Authenticate": "Bearer"})
            if verdict is not metricsauth.Verdict.ALLOWED:
                return web.Response(status=403, text="Forbidden\n")
            return await handler(request)

        middlewares.append(authorized)
    app = web.Application(middlewares=middlewares)
    app.router.add_get("/metrics", metrics)
    if pprof_routes:
        pprof.add_routes(app)
    if close is not None:

        async def on_cleanup(_: web.Application) -> None:
            await close()

        app.on_cleanup.append(on_cleanup)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port).start()
    except OSError as exc:
        await runner.cleanup()
        raise errors.ConfigError(f"cannot listen on {host}:{port} (--metrics-port): {exc.strerror or exc}") from exc
    return runner
