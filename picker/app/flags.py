"""``picker serve``'s flags and what they become: the reference EPP's flag names (and defaults) where it has them,
then picker's, parsed into ``Settings`` (and ``KubeSettings`` when endpoints come from Kubernetes).

The flags live here, apart from the wiring, so a new flag is one ``add(...)`` and one field in
``settings_from_args``; ``picker.serve`` and the chart's tests read the same parser.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging

from picker import compat, errors
from picker.discovery import kubesettings, static
from picker.peers import discovery as peer_discovery
from picker.scheduling import units
from picker.scheduling.units import add_bool_flag, port_arg
from picker.scheduling.units import duration_arg as parse_duration
from picker.settings import PeerSettings, ScrapeSettings, ServerSettings, Settings
from picker.telemetry import logs

__all__ = ["configure", "load", "parse_duration", "settings_from_args"]


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
    add_bool_flag(
        parser,
        "--hung-server-detection",
        default=srv.hung_server_detection,
        help="leave out of scheduling a server whose requests go overdue for their first answer while it answers "
        "nothing (picker/endpoints/hung.py); =false only to compare",
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
            hung_server_detection=args.hung_server_detection,
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
