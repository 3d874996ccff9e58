"""Engine configuration: the step-time model and named presets.

One engine step (one forward pass over the batch) takes

    step_s = overhead_s
           + prefill_overhead_s            if the batch holds any prefill tokens
           + prefill_s_per_token  * prefill tokens
           + decode_s_per_seq     * decoding sequences
           + context_s_per_token  * context tokens (KV read by every scheduled sequence, incl. this step's)
           + lora_overhead_s      if any sequence in the batch uses a LoRA adapter

all of it times ``slowdown`` (1.0; 2.5 plays a server 2.5x slower than its preset: a throttled or failing GPU,
a noisy neighbour — what no request counter sees).

Prefill/decode disaggregation: a request whose prompt was prefilled on another server (``remote_prefill``) pulls
its KV cache over the server's link instead of computing it: ``kv_transfer_s_per_token`` per prompt token not
cached locally (KV bytes per token / link bandwidth; ``link_s_per_token(bytes, gbps)``), one transfer
after another on the link, none of it inside an engine step. The presets' value is an 8B model's KV
(``KV_BYTES_PER_TOKEN_8B`` = 128 KiB per token: 32 layers x 8 KV heads x 128 x 2 x fp16) over 100 Gb/s.

The prefill step emits the first token, so an idle engine's TTFT for an n-token prompt with c cached tokens is
one step with n - c prefill tokens; every later token costs one decode step of the whole batch.

Presets (numbers each produces are checked by tests/sim/test_presets.py and listed in docs/simulator.md):

* ``h100-8b``: an 8B model on one H100, matched to the reference profile's TTFT and ITL (docs/simulator.md).
* ``cpu``: the seed's CPU server (16 sequences), fitted to its measurements one request at a time: a 13-token
  prompt's TTFT 0.110 s; a 116-token prompt's TTFT 0.772 s and 512 tokens streamed in 15.62 s (docs/simulator.md
  says why 116 tokens and where the fit misses).
* ``gpu-bounded``: ``h100-8b``'s step times on a GPU whose limits bind: 16 sequences and a 4096-token KV pool
  (256 blocks), so a few long answers fill the cache and the newest running request is preempted.
* ``fast``: tiny step times, for tests.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

__all__ = [
    "DEFAULT_LINK_GBPS",
    "KV_BYTES_PER_TOKEN_8B",
    "PRESETS",
    "EngineConfig",
    "StepTiming",
    "link_s_per_token",
    "preset",
]

KV_BYTES_PER_TOKEN_8B = 2 * 32 * 8 * 128 * 2  # K and V, 32 layers, 8 KV heads of 128, fp16: 131072
DEFAULT_LINK_GBPS = 100.0


def link_s_per_token(kv_bytes_per_token: float, link_gbps: float) -> float:
    """Seconds to move one token's KV cache over a link of ``link_gbps`` gigabits per second."""
    if kv_bytes_per_token < 0 or link_gbps <= 0:
        raise ValueError("kv_bytes_per_token must be >= 0 and link_gbps > 0")
    return kv_bytes_per_token * 8 / (link_gbps * 1e9)


@dataclass(frozen=True, slots=True)
class StepTiming:
    overhead_s: float
    prefill_s_per_token: float
    decode_s_per_seq: float
    context_s_per_token: float = 0.0
    prefill_overhead_s: float = 0.0
    lora_overhead_s: float = 0.0

    def step_s(self, *, prefill_tokens: int, decode_seqs: int, context_tokens: int, lora: bool) -> float:
        s = self.overhead_s
        if prefill_tokens:
            s += self.prefill_overhead_s + self.prefill_s_per_token * prefill_tokens
        s += self.decode_s_per_seq * decode_seqs + self.context_s_per_token * context_tokens
        if lora:
            s += self.lora_overhead_s
        return s


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """What one simulated vLLM engine is: its model names, limits, cache and speed."""

    timing: StepTiming
    model: str = "sim-model"
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    num_gpu_blocks: int = 4096
    block_size: int = 16
    enable_prefix_caching: bool = True
    enable_chunked_prefill: bool = True
    max_model_len: int = 8192
    lora_adapters: tuple[str, ...] = ()
    max_loras: int = 1
    max_waiting: int = 1000  # waiting-queue bound; more is rejected (HTTP 429)
    natural_output_tokens: int = 128  # mean answer length when the request lets the model stop (no ignore_eos)
    hash_seed: int = 0
    seed: int = 0
    slowdown: float = 1.0  # multiplies every step's duration
    # P/D: pulling a remotely prefilled prompt's KV, per token (module docstring)
    kv_transfer_s_per_token: float = link_s_per_token(KV_BYTES_PER_TOKEN_8B, DEFAULT_LINK_GBPS)

    def __post_init__(self) -> None:
        for name in ("max_num_seqs", "max_num_batched_tokens", "num_gpu_blocks", "block_size", "max_model_len"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")
        if self.max_loras < 0 or self.max_waiting < 0 or self.natural_output_tokens < 1:
            raise ValueError("max_loras/max_waiting must be >= 0 and natural_output_tokens >= 1")
        if not 0.0 < self.slowdown <= 100.0:
            raise ValueError("slowdown must be in (0, 100]")
        if not 0.0 <= self.kv_transfer_s_per_token <= 1.0:
            raise ValueError("kv_transfer_s_per_token must be in [0, 1] seconds")
        if self.model in self.lora_adapters:
            raise ValueError(f"LoRA adapter name {self.model!r} equals the base model name")

    def replace(self, **changes: object) -> EngineConfig:
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]

    @property
    def served_models(self) -> tuple[str, ...]:
        return (self.model, *self.lora_adapters)


# 8B (Llama-3.1-8B class) on one H100 80 GB: a decode step reads the weights once, a prefill step adds a fixed
# cost (not graph-captured) and a cost per token; the values and what they produce: docs/simulator.md.
_H100_8B = EngineConfig(
    timing=StepTiming(
        overhead_s=0.011,
        prefill_overhead_s=0.035,
        prefill_s_per_token=0.00012,
        decode_s_per_seq=0.00005,
        context_s_per_token=4e-8,
        lora_overhead_s=0.002,
    ),
    max_num_seqs=256,
    max_num_batched_tokens=8192,
    num_gpu_blocks=25000,
    max_model_len=8192,
)

PRESETS: dict[str, EngineConfig] = {
    "h100-8b": _H100_8B,
    # The seed's CPU server, fitted to its measurements one request at a time (docs/simulator.md).
    "cpu": EngineConfig(
        timing=StepTiming(
            overhead_s=0.02665,
            prefill_s_per_token=0.00641,
            decode_s_per_seq=0.002,
            context_s_per_token=1.1e-6,
        ),
        max_num_seqs=16,
        max_num_batched_tokens=2048,
        num_gpu_blocks=2048,
        max_model_len=4096,
    ),
    # h100-8b's speed where the slots and the KV cache run out: 16 sequences, 256 blocks (4096 tokens) - about
    # six 512-token answers with their prompts.
    "gpu-bounded": _H100_8B.replace(max_num_seqs=16, num_gpu_blocks=256, max_model_len=4096),
    "fast": EngineConfig(
        timing=StepTiming(overhead_s=0.002, prefill_s_per_token=0.00001, decode_s_per_seq=0.00002),
        max_num_seqs=32,
        max_num_batched_tokens=2048,
        num_gpu_blocks=512,
        max_model_len=4096,
    ),
}


def preset(name: str, **changes: object) -> EngineConfig:
    """A preset by name, with field overrides (``preset("fast", num_gpu_blocks=64)``)."""
    try:
        base = PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown preset {name!r}; choose from {', '.join(PRESETS)}") from None
    return base.replace(**changes) if changes else base
