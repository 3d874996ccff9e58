"""picker's own Prometheus metrics: the reference EPP's names, labels and buckets, plus a few of picker's.

Everything is registered in ``picker.telemetry.REGISTRY``. Names and buckets follow the reference
(``pkg/epp/metrics/metrics.go``, protocol.md §12) so existing dashboards and alerts keep working. Per-request
series are updated by the director and the response path; pool gauges are computed at scrape time by
``PoolCollector`` from a callback (no per-request cost, and always consistent with one endpoint snapshot).

This module sits in the bottom layer, so it takes plain values (``PodStats``), never endpoint objects.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass

from prometheus_client import Counter, Gauge
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from picker.telemetry import REGISTRY
from picker.telemetry.fast import FastHistogram

__all__ = [
    "ENDPOINT_EJECTIONS",
    "ENDPOINT_SUSPECT",
    "ENDPOINT_SUSPICIONS",
    "INFLIGHT_EXPIRED",
    "INFO",
    "INPUT_TOKENS",
    "MODEL_REWRITE_DECISIONS",
    "NTPOT",
    "OUTPUT_TOKENS",
    "PLUGIN_DURATION",
    "PROMPT_CACHED_TOKENS",
    "REQUEST_DURATION",
    "REQUEST_ERRORS",
    "REQUEST_SIZES",
    "REQUEST_TOTAL",
    "RESPONSE_SIZES",
    "RUNNING_REQUESTS",
    "SCHEDULER_ATTEMPTS",
    "SCHEDULER_E2E",
    "SCHEDULING_ERRORS",
    "PodStats",
    "PoolCollector",
    "register_pool_collector",
]

_MODEL_LABELS = ("model_name", "target_model_name")

# Buckets as in the reference (metrics.go).
_DURATION_BUCKETS = (
    0.005, 0.025, 0.05, 0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 1.25, 1.5, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0, 15.0, 20.0,
    30.0, 45.0, 60.0, 120.0, 180.0, 240.0, 300.0, 360.0, 480.0, 600.0, 900.0, 1200.0, 1800.0, 2700.0, 3600.0,
)  # fmt: skip
_REQUEST_SIZE_BUCKETS = tuple(float(64 * 2**i) for i in range(25))  # 64 B … 1 GiB
_RESPONSE_SIZE_BUCKETS = (1.0, 8.0, *(float(16 * 2**i) for i in range(13)))  # 1, 8, 16 … 65536
_INPUT_TOKEN_BUCKETS = (1.0, 8.0, *(float(16 * 2**i) for i in range(17)))  # 1, 8, 16 … 1048576
_OUTPUT_TOKEN_BUCKETS = (1.0, 8.0, *(float(16 * 2**i) for i in range(10)))  # 1, 8, 16 … 8192
_NTPOT_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0)
_SCHEDULER_BUCKETS = (0.0001, 0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1)

# prometheus_client appends ``_total`` to counter names itself.
REQUEST_TOTAL = Counter(
    "inference_objective_request",
    "Counter of inference objective requests broken out for each model and target model.",
    (*_MODEL_LABELS, "priority"),
    registry=REGISTRY,
)
REQUEST_ERRORS = Counter(
    "inference_objective_request_error",
    "Counter of inference objective requests errors broken out for each model and target model.",
    (*_MODEL_LABELS, "error_code"),
    registry=REGISTRY,
)
REQUEST_DURATION = FastHistogram(
    "inference_objective_request_duration_seconds",
    "Inference objective response latency distribution in seconds for each model and target model.",
    _MODEL_LABELS,
    buckets=_DURATION_BUCKETS,
    registry=REGISTRY,
)
REQUEST_SIZES = FastHistogram(
    "inference_objective_request_sizes",
    "Inference objective requests size distribution in bytes for each model and target model.",
    _MODEL_LABELS,
    buckets=_REQUEST_SIZE_BUCKETS,
    registry=REGISTRY,
)
RESPONSE_SIZES = FastHistogram(
    "inference_objective_response_sizes",
    "Inference objective responses size distribution in bytes for each model and target model.",
    _MODEL_LABELS,
    buckets=_RESPONSE_SIZE_BUCKETS,
    registry=REGISTRY,
)
INPUT_TOKENS = FastHistogram(
    "inference_objective_input_tokens",
    "Inference objective input token count distribution for requests in each model.",
    _MODEL_LABELS,
    buckets=_INPUT_TOKEN_BUCKETS,
    registry=REGISTRY,
)
OUTPUT_TOKENS = FastHistogram(
    "inference_objective_output_tokens",
    "Inference objective output token count distribution for requests in each model.",
    _MODEL_LABELS,
    buckets=_OUTPUT_TOKEN_BUCKETS,
    registry=REGISTRY,
)
PROMPT_CACHED_TOKENS = FastHistogram(
    "inference_objective_prompt_cached_tokens",
    "Inference objective prompt cached token count distribution for requests in each model.",
    _MODEL_LABELS,
    buckets=_INPUT_TOKEN_BUCKETS,
    registry=REGISTRY,
)
NTPOT = FastHistogram(
    "inference_objective_normalized_time_per_output_token_seconds",
    "Inference objective latency divided by number of output tokens in seconds for each model and target model.",
    _MODEL_LABELS,
    buckets=_NTPOT_BUCKETS,
    registry=REGISTRY,
)
RUNNING_REQUESTS = Gauge(
    "inference_objective_running_requests",
    "Inference objective number of running requests in each model.",
    ("model_name",),
    registry=REGISTRY,
)
SCHEDULER_E2E = FastHistogram(
    "inference_extension_scheduler_e2e_duration_seconds",
    "End-to-end scheduling latency distribution in seconds.",
    buckets=_SCHEDULER_BUCKETS,
    registry=REGISTRY,
)
SCHEDULER_ATTEMPTS = Counter(
    "inference_extension_scheduler_attempts",
    "Total number of successful and failed scheduling attempts.",
    ("status", "target_model_name", "pod_name", "namespace", "port"),
    registry=REGISTRY,
)
PLUGIN_DURATION = FastHistogram(
    "inference_extension_plugin_duration_seconds",
    "Plugin processing latency distribution in seconds for each extension point, plugin type and plugin name.",
    ("extension_point", "plugin_type", "plugin_name"),
    buckets=_SCHEDULER_BUCKETS,
    registry=REGISTRY,
)
INFO = Gauge(
    "inference_extension_info",
    "General information of the current build of Inference Extension.",
    ("commit", "build_ref"),
    registry=REGISTRY,
)

# picker's own series.
SCHEDULING_ERRORS = Counter(
    "picker_scheduling_errors",
    "Requests that ended in an error response before reaching a model server, by error code.",
    ("code",),
    registry=REGISTRY,
)
INFLIGHT_EXPIRED = Counter(
    "picker_inflight_expired",
    "In-flight leases released by timeout because no response phase ever reported completion.",
    registry=REGISTRY,
)
ENDPOINT_EJECTIONS = Counter(
    "picker_endpoint_ejections",
    "Endpoints ejected from scheduling by outlier detection (consecutive 5xx responses), by endpoint.",
    ("endpoint",),
    registry=REGISTRY,
)
ENDPOINT_SUSPICIONS = Counter(
    "picker_endpoint_suspicions",
    "Times an endpoint was suspected hung: a request overdue for its first answer, and no answer since it was sent.",
    registry=REGISTRY,
)
ENDPOINT_SUSPECT = Gauge(
    "picker_endpoint_suspect",
    "1 while an endpoint is suspected hung and left out of scheduling (no series otherwise), by endpoint.",
    ("endpoint",),
    registry=REGISTRY,
)
MODEL_REWRITE_DECISIONS = Counter(
    "inference_extension_model_rewrite_decisions",
    "Requests whose model an InferenceModelRewrite rewrote, by rewrite, incoming model and target model.",
    ("model_rewrite_name", "model_name", "target_model"),
    registry=REGISTRY,
)


@dataclass(frozen=True, slots=True)
class PodStats:
    """One endpoint as the pool gauges see it."""

    name: str  # pod name (or ip:port for static endpoints)
    waiting: int
    running: int
    kv_usage: float
    ready: bool  # a scheduling candidate (not excluded as stale/failing)


class PoolCollector(Collector):
    """Computes the ``inference_pool_*`` gauges from the current endpoints at scrape time."""

    def __init__(self, pool_name: Callable[[], str], pods: Callable[[], Sequence[PodStats]]) -> None:
        self._pool_name = pool_name
        self._pods = pods

    def collect(self) -> Iterator[GaugeMetricFamily]:
        name = self._pool_name()
        pods = self._pods()
        n = len(pods)
        kv = GaugeMetricFamily(
            "inference_pool_average_kv_cache_utilization",
            "The average kv cache utilization for an inference server pool.",
            labels=("name",),
        )
        queue = GaugeMetricFamily(
            "inference_pool_average_queue_size",
            "The average number of requests pending in the model server queue.",
            labels=("name",),
        )
        running = GaugeMetricFamily(
            "inference_pool_average_running_requests",
            "The average number of requests currently being processed by the model servers.",
            labels=("name",),
        )
        ready = GaugeMetricFamily(
            "inference_pool_ready_pods",
            "The number of ready pods in the inference server pool.",
            labels=("name",),
        )
        per_pod = GaugeMetricFamily(
            "inference_pool_per_pod_queue_size",
            "The total number of requests pending in the model server queue for each underlying pod.",
            labels=("name", "model_server_pod"),
        )
        kv.add_metric((name,), sum(p.kv_usage for p in pods) / n if n else 0.0)
        queue.add_metric((name,), sum(p.waiting for p in pods) / n if n else 0.0)
        running.add_metric((name,), sum(p.running for p in pods) / n if n else 0.0)
        ready.add_metric((name,), float(sum(1 for p in pods if p.ready)))
        for p in pods:
            per_pod.add_metric((name, p.name), float(p.waiting))
        yield from (kv, queue, running, ready, per_pod)

    def describe(self) -> Iterable[GaugeMetricFamily]:
        return ()  # computed lazily; nothing to check at registration


def register_pool_collector(pool_name: Callable[[], str], pods: Callable[[], Sequence[PodStats]]) -> PoolCollector:
    """Register a pool collector (the app does this once; unregister with ``REGISTRY.unregister``)."""
    collector = PoolCollector(pool_name, pods)
    REGISTRY.register(collector)
    return collector
