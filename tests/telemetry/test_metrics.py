"""picker's metrics: reference names and labels in picker's own registry; pool gauges computed at scrape time."""

from __future__ import annotations

from prometheus_client import generate_latest

from picker.telemetry import REGISTRY
from picker.telemetry import metrics as m

REFERENCE_NAMES = {
    "inference_objective_request_total": ("model_name", "target_model_name", "priority"),
    "inference_objective_request_error_total": ("model_name", "target_model_name", "error_code"),
    "inference_objective_request_duration_seconds": ("model_name", "target_model_name"),
    "inference_objective_request_sizes": ("model_name", "target_model_name"),
    "inference_objective_response_sizes": ("model_name", "target_model_name"),
    "inference_objective_input_tokens": ("model_name", "target_model_name"),
    "inference_objective_output_tokens": ("model_name", "target_model_name"),
    "inference_objective_prompt_cached_tokens": ("model_name", "target_model_name"),
    "inference_objective_normalized_time_per_output_token_seconds": ("model_name", "target_model_name"),
    "inference_objective_running_requests": ("model_name",),
    "inference_extension_scheduler_e2e_duration_seconds": (),
    "inference_extension_scheduler_attempts_total": ("status", "target_model_name", "pod_name", "namespace", "port"),
    "inference_extension_plugin_duration_seconds": ("extension_point", "plugin_type", "plugin_name"),
    "inference_extension_info": ("commit", "build_ref"),
}


def test_reference_metrics_exist_with_reference_labels() -> None:
    objects = [getattr(m, name) for name in m.__all__ if hasattr(getattr(m, name), "_labelnames")]
    by_name = {o._name + ("_total" if o._type == "counter" else ""): o for o in objects}
    for name, labels in REFERENCE_NAMES.items():
        assert name in by_name, name
        assert tuple(by_name[name]._labelnames) == labels, name
    m.REQUEST_TOTAL.labels("a", "b", "0").inc()
    text = generate_latest(REGISTRY).decode()
    assert 'inference_objective_request_total{model_name="a",priority="0",target_model_name="b"}' in text


def test_histogram_buckets_follow_the_reference() -> None:
    assert m.REQUEST_DURATION._upper_bounds[:-1][0] == 0.005  # type: ignore[attr-defined]
    assert len(m.REQUEST_DURATION._upper_bounds) - 1 == 35  # type: ignore[attr-defined]
    assert m.REQUEST_SIZES._upper_bounds[-2] == 1024**3  # type: ignore[attr-defined]
    assert m.INPUT_TOKENS._upper_bounds[-2] == 1048576  # type: ignore[attr-defined]
    assert m.OUTPUT_TOKENS._upper_bounds[-2] == 8192  # type: ignore[attr-defined]
    assert m.RESPONSE_SIZES._upper_bounds[-2] == 65536  # type: ignore[attr-defined]


def test_pool_collector_reports_averages_ready_pods_and_per_pod_queues() -> None:
    pods = [
        m.PodStats(name="pod-a", waiting=2, running=4, kv_usage=0.5, ready=True),
        m.PodStats(name="pod-b", waiting=6, running=0, kv_usage=0.1, ready=False),
    ]
    collector = m.register_pool_collector(lambda: "pool-x", lambda: pods)
    try:
        value = REGISTRY.get_sample_value
        assert value("inference_pool_average_queue_size", {"name": "pool-x"}) == 4.0
        assert value("inference_pool_average_running_requests", {"name": "pool-x"}) == 2.0
        assert value("inference_pool_average_kv_cache_utilization", {"name": "pool-x"}) == 0.3
        assert value("inference_pool_ready_pods", {"name": "pool-x"}) == 1.0
        assert value("inference_pool_per_pod_queue_size", {"name": "pool-x", "model_server_pod": "pod-b"}) == 6.0
        pods.clear()
        assert value("inference_pool_average_queue_size", {"name": "pool-x"}) == 0.0
    finally:
        REGISTRY.unregister(collector)
