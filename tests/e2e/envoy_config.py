"""Envoy configurations for the end-to-end tests: the reference ext_proc setup in front of picker.

Mirrors the reference EPP's test envoy.yaml (protocol.md §9): ext_proc over TLS to picker, body mode
FULL_DUPLEX_STREAMED (or BUFFERED), upstream ORIGINAL_DST routed by ``x-gateway-destination-endpoint``.
Two additions a plain Envoy needs to behave like a gateway's InferencePool backend:
- a header_mutation filter *before* ext_proc strips any client-sent destination header, so a client can never
  choose its endpoint (not even when picker is down and the filter fails open);
- requests that reach the router without a destination header (picker down, FailOpen) go to a round-robin
  cluster of the pool, the way a gateway falls back to "any pod" of the InferencePool.
"""

from __future__ import annotations

from typing import Any

import yaml

DESTINATION = "x-gateway-destination-endpoint"


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
) -> str:
    """The Envoy bootstrap YAML. ``with_picker=False`` gives a plain round-robin gateway (the demo's baseline)."""
    http_filters: list[dict[str, Any]] = [
        {
            "name": "strip-client-destination",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.http.header_mutation.v3.HeaderMutation",
                "mutations": {"request_mutations": [{"remove": DESTINATION}]},
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
    routes.append({"match": {"prefix": "/"}, "route": {"cluster": "pool_round_robin", "timeout": "120s"}})

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
                        {
                            "endpoint": {
                                "address": {"socket_address": {"address": "127.0.0.1", "port_value": picker_port}}
                            }
                        }
                    ]
                }
            ],
        },
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
            "name": "pool_round_robin",
            "type": "STATIC",
            "lb_policy": "ROUND_ROBIN",
            "connect_timeout": "2s",
            "load_assignment": {
                "cluster_name": "pool_round_robin",
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
