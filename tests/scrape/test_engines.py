from __future__ import annotations

from pathlib import Path

import pytest

from picker.endpoints.model import EndpointMetrics
from picker.scrape import engines
from picker.scrape.errors import ScrapeError
from picker.scrape.prometheus import ExpositionError

TESTDATA = Path(__file__).parent / "testdata"


def page(name: str) -> bytes:
    return (TESTDATA / name).read_bytes()


@pytest.mark.parametrize(
    ("engine", "golden", "expected"),
    [
        (
            "vllm",
            "vllm.txt",
            EndpointMetrics(
                waiting=3,
                running=12,
                kv_usage=0.4375,
                running_loras=frozenset({"sql-lora", "chat-lora"}),
                waiting_loras=frozenset({"tool-lora"}),
                max_loras=4,
                block_size=16,
                num_gpu_blocks=27153,
                generated_tokens=183402.0,
                prefix_query_tokens=912384.0,
                prefix_hit_tokens=655360.0,
                updated_at=5.0,
            ),
        ),
        (
            "vllm",
            "vllm_old.txt",  # vllm:gpu_cache_usage_perc, no LoRA info
            EndpointMetrics(waiting=7, running=4, kv_usage=0.91, block_size=32, num_gpu_blocks=4096, updated_at=5.0),
        ),
        (
            "sglang",
            "sglang.txt",
            EndpointMetrics(waiting=5, running=9, kv_usage=0.62, block_size=1, num_gpu_blocks=65536, updated_at=5.0),
        ),
        (
            "trtllm-serve",
            "trtllm_serve.txt",
            EndpointMetrics(waiting=2, running=6, kv_usage=0.25, block_size=64, num_gpu_blocks=8192, updated_at=5.0),
        ),
        (
            "triton",
            "triton.txt",
            EndpointMetrics(waiting=4, running=8, kv_usage=0.5, block_size=128, num_gpu_blocks=4096, updated_at=5.0),
        ),
    ],
)
def test_golden_pages(engine: str, golden: str, expected: EndpointMetrics) -> None:
    assert engines.extract(engine, page(golden), 5.0) == expected


def test_a_work_counter_that_is_no_count_is_left_out_not_a_failed_scrape() -> None:
    bad = page("vllm.txt").replace(b"} 183402.0", b"} -1.0").replace(b"} 655360.0", b"} NaN")
    metrics = engines.extract("vllm", bad, 5.0)
    assert (metrics.generated_tokens, metrics.prefix_query_tokens, metrics.prefix_hit_tokens) == (None, 912384.0, None)
    assert metrics.running == 12


def test_new_kv_name_wins_over_the_old_one() -> None:
    both = b"vllm:num_requests_waiting 0\nvllm:num_requests_running 0\n"
    both += b"vllm:gpu_cache_usage_perc 0.9\nvllm:kv_cache_usage_perc 0.2\n"
    assert engines.extract("vllm", both, 0.0).kv_usage == 0.2


def test_lora_info_series_with_the_largest_value_wins_whatever_its_position() -> None:
    lines = [
        b"vllm:num_requests_waiting 0",
        b"vllm:num_requests_running 0",
        b"vllm:kv_cache_usage_perc 0",
        b'vllm:lora_requests_info{max_lora="2",running_lora_adapters="newest",waiting_lora_adapters=""} 300',
        b'vllm:lora_requests_info{max_lora="2",running_lora_adapters="old",waiting_lora_adapters="x"} 100',
        b'vllm:lora_requests_info{max_lora="2",running_lora_adapters="nan",waiting_lora_adapters=""} NaN',
    ]
    metrics = engines.extract("vllm", b"\n".join(lines), 0.0)
    assert metrics.running_loras == frozenset({"newest"})
    assert metrics.waiting_loras == frozenset()
    assert metrics.max_loras == 2


def test_lora_info_with_empty_lists_and_bad_max_lora() -> None:
    page_bytes = b"vllm:num_requests_waiting 0\nvllm:num_requests_running 0\nvllm:kv_cache_usage_perc 0\n"
    page_bytes += b'vllm:lora_requests_info{max_lora="many",running_lora_adapters=" , ,",waiting_lora_adapters=""} 1\n'
    metrics = engines.extract("vllm", page_bytes, 0.0)
    assert metrics.running_loras == frozenset()
    assert metrics.max_loras == 0


def test_cache_config_junk_labels_become_none() -> None:
    core = b"vllm:num_requests_waiting 0\nvllm:num_requests_running 0\nvllm:kv_cache_usage_perc 0\n"
    metrics = engines.extract("vllm", core + b'vllm:cache_config_info{block_size="x",num_gpu_blocks="0"} 1\n', 0.0)
    assert metrics.block_size is None
    assert metrics.num_gpu_blocks is None


def test_triton_reads_the_matching_label_not_the_first_series() -> None:
    metrics = engines.extract("triton", page("triton.txt"), 0.0)
    assert (metrics.waiting, metrics.running) == (4, 8)  # not request_type="context" / "max"


@pytest.mark.parametrize(
    ("engine", "golden", "missing"),
    [
        ("vllm", "sglang.txt", "vllm:num_requests_waiting"),
        ("sglang", "vllm.txt", "sglang:num_queue_reqs"),
        ("triton", "trtllm_serve.txt", "request_type"),
    ],
)
def test_page_without_core_series_raises(engine: str, golden: str, missing: str) -> None:
    with pytest.raises(ScrapeError, match=missing) as info:
        engines.extract(engine, page(golden), 0.0)
    assert info.value.reason == "missing"


def test_missing_kv_names_both_alternatives_in_the_message() -> None:
    with pytest.raises(ScrapeError, match="kv_cache_usage_perc or vllm:gpu_cache_usage_perc"):
        engines.extract("vllm", b"vllm:num_requests_waiting 0\nvllm:num_requests_running 0\n", 0.0)


def test_malformed_core_line_is_a_parse_error_chained_from_the_parser() -> None:
    with pytest.raises(ScrapeError) as info:
        engines.extract("vllm", b"vllm:num_requests_waiting{model_name=x} 1\n", 0.0)
    assert info.value.reason == "parse"
    assert isinstance(info.value.__cause__, ExpositionError)


@pytest.mark.parametrize("value", [b"NaN", b"-1", b"+Inf"])
def test_impossible_counts_raise(value: bytes) -> None:
    page_bytes = b"vllm:num_requests_waiting " + value + b"\nvllm:num_requests_running 0\nvllm:kv_cache_usage_perc 0\n"
    with pytest.raises(ScrapeError) as info:
        engines.extract("vllm", page_bytes, 0.0)
    assert info.value.reason == "value"


def test_kv_usage_is_clamped_and_nan_rejected() -> None:
    core = b"vllm:num_requests_waiting 0\nvllm:num_requests_running 0\n"
    assert engines.extract("vllm", core + b"vllm:kv_cache_usage_perc 1.7\n", 0.0).kv_usage == 1.0
    assert engines.extract("vllm", core + b"vllm:kv_cache_usage_perc -0.1\n", 0.0).kv_usage == 0.0
    with pytest.raises(ScrapeError, match="NaN"):
        engines.extract("vllm", core + b"vllm:kv_cache_usage_perc NaN\n", 0.0)


def test_engine_names_aliases_and_unknown_fallback() -> None:
    assert engines.mapping_for("SGLang").name == "sglang"
    assert engines.mapping_for("trtllm").name == "trtllm-serve"
    assert engines.mapping_for("triton-tensorrt-llm").name == "triton"
    assert engines.is_known("vllm")
    assert not engines.is_known("tgi")
    assert engines.mapping_for("tgi").name == engines.DEFAULT_ENGINE
    assert engines.extract("tgi", page("vllm.txt"), 0.0).waiting == 3


def test_every_mapping_names_its_series() -> None:
    for mapping in engines.ENGINES.values():
        assert mapping.names >= {s.name for s in (*mapping.waiting, *mapping.running, *mapping.kv_usage)}
