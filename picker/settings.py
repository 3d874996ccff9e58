"""Settings: frozen values built once by the CLI and passed down. Never global.

Flag names follow the reference EPP where it has them (``--grpc-port``, ``--grpc-health-port``,
``--metrics-port``, ``--secure-serving``, ``--cert-path``, ``--config-file``, ``--config-text``,
``--refresh-metrics-interval``, ``--metrics-staleness-threshold``, ``--disable-endpoint-subset-filter``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["PeerSettings", "ScrapeSettings", "ServerSettings", "Settings", "StaticEndpoint"]


@dataclass(frozen=True, slots=True)
class StaticEndpoint:
    address: str
    port: int
    metrics_url: str | None = None  # default http://<address>:<port>/metrics
    engine: str = "vllm"
    name: str = ""
    labels: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class ServerSettings:
    host: str = "0.0.0.0"
    grpc_port: int = 9002
    health_port: int = 9003
    metrics_port: int = 9090  # 0 disables the metrics HTTP server
    secure_serving: bool = True  # TLS on the ext_proc port
    cert_path: str | None = None  # directory with tls.crt and tls.key; None: self-signed at start
    cert_reload: bool = True  # --enable-cert-reload: serve a rotated cert_path pair without a restart
    client_ca_file: str | None = None  # PEM bundle: require gateway client certificates signed by it (mTLS)
    metrics_auth_token_file: str | None = None  # /metrics needs "Authorization: Bearer <file contents>"
    metrics_endpoint_auth: bool = False  # /metrics needs a Kubernetes token allowed to GET /metrics
    max_header_bytes: int = 64 * 1024  # request headers (names + values) over this get 431
    retry_after_s: int = 0  # Retry-After on 429/503 answers (0: none)
    max_body_bytes: int = 16 * 1024 * 1024  # request bodies over this get 413
    max_response_buffer_bytes: int = 16 * 1024 * 1024  # non-streamed response bodies buffered for usage
    gateway_profile: str = "auto"  # auto | envoy | nginx | agentgateway
    disable_subset_filter: bool = False
    explain_header: bool = False  # add x-picker-explain to the request headers response
    hung_server_detection: bool = True  # suspect servers that answer nothing (endpoints/hung.py)
    shed_status: int = 429  # status of a shed sheddable request (docs say 503, code says 429)
    inflight_timeout_s: float = 300.0  # release a lease when no response phase ever arrives
    grace_period_s: float = 5.0  # SIGTERM: refuse new streams after this, then wait for in-flight ones
    termination_grace_s: float = 120.0
    tracing: bool = False  # --tracing: OpenTelemetry spans, exported per OTEL_* (telemetry/tracing.py)
    enable_pprof: bool = False  # --enable-pprof: /debug/pprof/ on the metrics port (telemetry/pprof.py)
    health_checking: bool = True  # --health-checking (default true here): gRPC health on the ext_proc port as well
    # --workers: a worker shares the ext_proc and health ports with its siblings (SO_REUSEPORT) and serves its
    # /metrics on loopback only, for the supervisor to merge (picker/serve.py); a lone picker refuses a taken port
    reuse_port: bool = False
    metrics_host: str = ""  # "" : ``host``
    # --grpc-frontend: who runs the ext_proc port's HTTP/2 and gRPC. native: picker.extproc._front (Rust, off the
    # GIL); grpc: grpc.aio; auto: native when it is built
    grpc_frontend: str = "auto"


@dataclass(frozen=True, slots=True)
class ScrapeSettings:
    interval_s: float = 0.1  # --refresh-metrics-interval
    timeout_s: float = 1.0  # per poll
    staleness_s: float = 2.0  # --metrics-staleness-threshold: older data ⇒ endpoint excluded
    fail_threshold: int = 3  # consecutive failed polls before an endpoint is excluded
    recover_threshold: int = 2  # consecutive good polls before it is readmitted
    max_response_bytes: int = 4 * 1024 * 1024  # a /metrics page larger than this is an error
    # --workers: this worker's index among the pod's ``share_count`` workers, which poll each server once between
    # them over their peer exchange (picker/scrape/share.py); a count of 1 polls every server
    share_index: int = 0
    share_count: int = 1


@dataclass(frozen=True, slots=True)
class PeerSettings:
    """The exchange between active-active replicas (docs/ha.md); off unless peers are given."""

    peers: tuple[str, ...] = ()  # --peers: host:port of the other replicas
    service: str = ""  # --peer-service: picker's Service, whose EndpointSlices name the replicas
    port: int = 9005  # --peer-port (0: any free port; not with --peer-service)
    flush_interval_s: float = 0.002  # --peer-flush-interval
    state_ttl_s: float = 1.0  # --peer-state-ttl: a peer silent this long stops counting
    bind_host: str = ""  # "": the server's --host (workers of one pod exchange over loopback)

    @property
    def enabled(self) -> bool:
        return bool(self.peers or self.service)


@dataclass(frozen=True, slots=True)
class Settings:
    server: ServerSettings = field(default_factory=ServerSettings)
    scrape: ScrapeSettings = field(default_factory=ScrapeSettings)
    peers: PeerSettings = field(default_factory=PeerSettings)
    static_endpoints: tuple[StaticEndpoint, ...] = ()
    config_file: str | None = None
    config_text: str | None = None
    log_level: str = "info"
    log_format: str = "json"  # json | text
    # --prefilter-endpoints: larger pools score only this many least loaded candidates plus the prefix holders
    # (scheduling/prefilter.py); 0 scores every candidate
    prefilter_endpoints: int = 64
