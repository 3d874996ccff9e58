"""The metrics page: the fast renderer and prometheus_client agree; histograms count and sum right."""

from __future__ import annotations

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from picker.sim.config import EngineConfig, StepTiming
from picker.sim.engine import Engine, SimRequest
from picker.sim.metrics import SimMetrics
from picker.sim.tokenizer import default_tokenizer

TIMING = StepTiming(overhead_s=2**-7, prefill_s_per_token=0.0, decode_s_per_seq=0.0)  # exact in binary
WORDS = default_tokenizer().word_ids


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
    }


def loaded_metrics() -> SimMetrics:
    engine = Engine(EngineConfig(timing=TIMING, model='we"ird\\name', lora_adapters=("x",)))
    metrics = SimMetrics(engine, wall_clock=lambda: 1234.5)
    engine.submit(SimRequest("a", WORDS[:40], max_tokens=3, ignore_eos=True), 0.0)
    engine.submit(SimRequest("b", WORDS[:40], max_tokens=5, ignore_eos=True, lora="x"), 0.0)
    now = 0.0
    while engine.has_work:
        end = engine.begin_step(now)
        assert end is not None
        metrics.record(engine.finish_step())
        now = end
    return metrics


def test_render_and_registry_agree() -> None:
    metrics = loaded_metrics()
    assert samples(metrics.render().decode()) == samples(generate_latest(metrics.registry).decode())


def test_values() -> None:
    page = samples(loaded_metrics().render().decode())
    model = (("engine", "0"), ("model_name", 'we"ird\\name'))
    assert page[("vllm:generation_tokens_total", model)] == 8
    assert page[("vllm:prompt_tokens_total", model)] == 80
    assert page[("vllm:time_to_first_token_seconds_count", model)] == 2
    assert page[("vllm:time_to_first_token_seconds_sum", model)] == 2 * 2**-7  # both prefilled in one step
    assert page[("vllm:inter_token_latency_seconds_count", model)] == 6
    assert page[("vllm:time_to_first_token_seconds_bucket", (model[0], ("le", "0.005"), model[1]))] == 0
    assert page[("vllm:time_to_first_token_seconds_bucket", (model[0], ("le", "0.01"), model[1]))] == 2
    assert page[("vllm:inter_token_latency_seconds_bucket", (model[0], ("le", "0.01"), model[1]))] == 6
    assert page[("vllm:e2e_request_latency_seconds_bucket", (model[0], ("le", "+Inf"), model[1]))] == 2
    assert page[("vllm:request_success_total", (("engine", "0"), ("finish_reason", "length"), model[1]))] == 2
    assert page[("vllm:request_generation_tokens_sum", model)] == 8
    lora = (("max_lora", "1"), ("running_lora_adapters", ""), ("waiting_lora_adapters", ""))
    assert page[("vllm:lora_requests_info", lora)] == 1234.5
