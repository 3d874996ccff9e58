"""Engine mappings: which series of a model server's ``/metrics`` page fill which ``EndpointMetrics`` field.

* vllm: waiting ``vllm:num_requests_waiting``; running ``vllm:num_requests_running``; KV usage
  ``vllm:kv_cache_usage_perc``, else the older ``vllm:gpu_cache_usage_perc``; LoRA ``vllm:lora_requests_info``;
  cache config ``vllm:cache_config_info`` labels ``block_size``, ``num_gpu_blocks``; work counters
  ``vllm:generation_tokens_total``, ``vllm:prefix_cache_queries_total``, ``vllm:prefix_cache_hits_total``.
* sglang: ``sglang:num_queue_reqs``; ``sglang:num_running_reqs``; ``sglang:token_usage``; cache config
  ``sglang:cache_config_info`` labels ``page_size``, ``num_pages``.
* trtllm-serve: ``trtllm_num_requests_waiting``; ``trtllm_num_requests_running``;
  ``trtllm_kv_cache_utilization``; cache config gauges ``trtllm_kv_cache_tokens_per_block``,
  ``trtllm_kv_cache_max_blocks``.
* triton (Triton's TensorRT-LLM backend): ``nv_trt_llm_request_metrics{request_type=waiting}``;
  ``…{request_type=scheduled}``; ``nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type=fraction}``; cache
  config ``…{kv_cache_block_type=tokens_per}``, ``…{kv_cache_block_type=max}``.

Rules (the reference EPP's): among series matching a selector the one with the largest timestamp wins (the
first when there are none). The LoRA info gauge's *value* is a creation timestamp: the series with the largest
value wins; its ``running_lora_adapters``/``waiting_lora_adapters`` labels are comma lists (blanks trimmed, may
be empty) and ``max_lora`` an integer. Waiting, running and KV usage are required (``ScrapeError`` when a page
lacks them); LoRA, cache config and the work counters are optional. KV usage is clamped to [0, 1].

The engine of an endpoint comes from ``Endpoint.engine`` (the pod label
``inference.networking.k8s.io/engine-type``). An unknown engine name uses the vLLM mapping, as the reference
does for unlabelled pods; ``is_known`` lets the poller warn about it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from picker.endpoints.model import EndpointMetrics
from picker.scrape.errors import ScrapeError
from picker.scrape.prometheus import ExpositionError, Sample, Selector, pick_largest_value, pick_latest, scan

__all__ = ["DEFAULT_ENGINE", "ENGINES", "EngineMapping", "extract", "is_known", "mapping_for"]

S = Selector.parse


@dataclass(frozen=True, slots=True)
class EngineMapping:
    name: str
    waiting: tuple[Selector, ...]  # alternatives, first one present on the page wins
    running: tuple[Selector, ...]
    kv_usage: tuple[Selector, ...]
    lora_info: Selector | None = None
    cache_info: Selector | None = None  # info gauge whose labels carry the cache config
    block_size_label: str = "block_size"
    num_blocks_label: str = "num_gpu_blocks"
    block_size_gauge: Selector | None = None  # or plain gauges carrying it
    num_blocks_gauge: Selector | None = None
    # Work counters (optional): tokens generated, prompt tokens looked up in the prefix cache, tokens found there
    generated: Selector | None = None
    prefix_queries: Selector | None = None
    prefix_hits: Selector | None = None
    names: frozenset[str] = field(init=False, repr=False)  # every metric name to look for on a page

    def __post_init__(self) -> None:
        selectors = [*self.waiting, *self.running, *self.kv_usage]
        optional = (self.lora_info, self.cache_info, self.block_size_gauge, self.num_blocks_gauge)
        selectors += [s for s in (*optional, self.generated, self.prefix_queries, self.prefix_hits) if s]
        object.__setattr__(self, "names", frozenset(s.name for s in selectors))


VLLM = EngineMapping(
    name="vllm",
    waiting=(S("vllm:num_requests_waiting"),),
    running=(S("vllm:num_requests_running"),),
    kv_usage=(S("vllm:kv_cache_usage_perc"), S("vllm:gpu_cache_usage_perc")),
    lora_info=S("vllm:lora_requests_info"),
    cache_info=S("vllm:cache_config_info"),
    generated=S("vllm:generation_tokens_total"),
    prefix_queries=S("vllm:prefix_cache_queries_total"),
    prefix_hits=S("vllm:prefix_cache_hits_total"),
)
SGLANG = EngineMapping(
    name="sglang",
    waiting=(S("sglang:num_queue_reqs"),),
    running=(S("sglang:num_running_reqs"),),
    kv_usage=(S("sglang:token_usage"),),
    cache_info=S("sglang:cache_config_info"),
    block_size_label="page_size",
    num_blocks_label="num_pages",
)
TRTLLM_SERVE = EngineMapping(
    name="trtllm-serve",
    waiting=(S("trtllm_num_requests_waiting"),),
    running=(S("trtllm_num_requests_running"),),
    kv_usage=(S("trtllm_kv_cache_utilization"),),
    block_size_gauge=S("trtllm_kv_cache_tokens_per_block"),
    num_blocks_gauge=S("trtllm_kv_cache_max_blocks"),
)
TRITON = EngineMapping(
    name="triton",
    waiting=(S("nv_trt_llm_request_metrics{request_type=waiting}"),),
    running=(S("nv_trt_llm_request_metrics{request_type=scheduled}"),),
    kv_usage=(S("nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type=fraction}"),),
    block_size_gauge=S("nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type=tokens_per}"),
    num_blocks_gauge=S("nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type=max}"),
)

DEFAULT_ENGINE = VLLM.name
ENGINES: Mapping[str, EngineMapping] = {m.name: m for m in (VLLM, SGLANG, TRTLLM_SERVE, TRITON)}
_ALIASES: Mapping[str, str] = {
    "trtllm": "trtllm-serve",
    "tensorrt-llm": "trtllm-serve",
    "triton-tensorrt-llm": "triton",
    "triton-trtllm": "triton",
}


def is_known(engine: str) -> bool:
    name = engine.strip().lower()
    return name in ENGINES or name in _ALIASES


def mapping_for(engine: str) -> EngineMapping:
    """The mapping of an engine name (case-insensitive, aliases accepted); unknown names get vLLM's."""
    name = engine.strip().lower()
    return ENGINES.get(_ALIASES.get(name, name), VLLM)


def extract(engine: str, page: bytes, now: float) -> EndpointMetrics:
    """Read one ``/metrics`` page of the given engine into ``EndpointMetrics`` stamped ``updated_at=now``."""
    mapping = mapping_for(engine)
    try:
        found = scan(page, mapping.names)
    except ExpositionError as exc:
        raise ScrapeError("parse", f"{mapping.name} metrics page: {exc}") from exc
    waiting = _count(_required(found, mapping.waiting, mapping.name))
    running = _count(_required(found, mapping.running, mapping.name))
    kv = _required(found, mapping.kv_usage, mapping.name)
    if math.isnan(kv.value):
        raise ScrapeError("value", f"{kv.name} is NaN")
    running_loras, waiting_loras, max_loras = _loras(found, mapping.lora_info)
    block_size, num_blocks = _cache_config(found, mapping)
    return EndpointMetrics(
        waiting=waiting,
        running=running,
        kv_usage=min(1.0, max(0.0, kv.value)),
        running_loras=running_loras,
        waiting_loras=waiting_loras,
        max_loras=max_loras,
        block_size=block_size,
        num_gpu_blocks=num_blocks,
        generated_tokens=_counter(found, mapping.generated),
        prefix_query_tokens=_counter(found, mapping.prefix_queries),
        prefix_hit_tokens=_counter(found, mapping.prefix_hits),
        updated_at=now,
    )


def _required(found: Mapping[str, list[Sample]], selectors: Sequence[Selector], engine: str) -> Sample:
    for selector in selectors:
        sample = pick_latest(found.get(selector.name, ()), selector)
        if sample is not None:
            return sample
    wanted = " or ".join(str(s) for s in selectors)
    raise ScrapeError("missing", f"{engine} metrics page lacks {wanted}")


def _counter(found: Mapping[str, list[Sample]], selector: Selector | None) -> float | None:
    """An optional counter's value; None when absent or not a count (it only informs, never fails a scrape)."""
    sample = pick_latest(found.get(selector.name, ()), selector) if selector else None
    if sample is None or not math.isfinite(sample.value) or sample.value < 0:
        return None
    return sample.value


def _count(sample: Sample) -> int:
    if not math.isfinite(sample.value) or sample.value < 0:
        raise ScrapeError("value", f"{sample.name} is {sample.value}, not a count")
    return round(sample.value)


def _loras(found: Mapping[str, list[Sample]], selector: Selector | None) -> tuple[frozenset[str], frozenset[str], int]:
    if selector is None:
        return frozenset(), frozenset(), 0
    info = pick_largest_value(found.get(selector.name, ()), selector)
    if info is None:
        return frozenset(), frozenset(), 0
    return (
        _adapter_set(info.labels.get("running_lora_adapters", "")),
        _adapter_set(info.labels.get("waiting_lora_adapters", "")),
        _positive_int(info.labels.get("max_lora")) or 0,
    )


def _adapter_set(text: str) -> frozenset[str]:
    return frozenset(name for part in text.split(",") if (name := part.strip()))


def _cache_config(found: Mapping[str, list[Sample]], mapping: EngineMapping) -> tuple[int | None, int | None]:
    block_size: int | None = None
    num_blocks: int | None = None
    if mapping.cache_info is not None:
        info = pick_latest(found.get(mapping.cache_info.name, ()), mapping.cache_info)
        if info is not None:
            block_size = _positive_int(info.labels.get(mapping.block_size_label))
            num_blocks = _positive_int(info.labels.get(mapping.num_blocks_label))
    if mapping.block_size_gauge is not None:
        gauge = pick_latest(found.get(mapping.block_size_gauge.name, ()), mapping.block_size_gauge)
        block_size = _positive_int(gauge.value) if gauge else block_size
    if mapping.num_blocks_gauge is not None:
        gauge = pick_latest(found.get(mapping.num_blocks_gauge.name, ()), mapping.num_blocks_gauge)
        num_blocks = _positive_int(gauge.value) if gauge else num_blocks
    return block_size, num_blocks


def _positive_int(raw: str | float | None) -> int | None:
    """A positive integer from a label value or gauge value; anything else (absent, junk, 0, NaN) is None."""
    if raw is None:
        return None
    try:
        value = float(raw)
    except ValueError:
        return None
    if not math.isfinite(value) or value < 1 or value != int(value):
        return None
    return int(value)
