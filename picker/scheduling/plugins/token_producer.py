"""token-producer: where the precise prefix scorer's token ids come from (llm-d's data producer).

Type ``token-producer``; no scheduling role here (a ``ConfiguredPlugin`` of kind ``token-producer``): ``picker
serve`` builds its token source from these parameters (``picker.kvevents.tokens``) and looks the ids up before
scheduling, for every request, when a ``precise-prefix-cache-scorer`` is configured. Without this plugin the
defaults below apply.

Parameters (llm-d's): ``modelName`` (accepted; the request's target model is what is tokenised), ``vllm``
{``http`` "" (a fixed tokenizer server, e.g. a sidecar ``http://localhost:8000``; empty: one of the request's
candidate endpoints, chosen by the prompt's hash), ``timeout`` 100ms (llm-d: 5s; a lookup slower than this
fails open)}. picker's: ``api`` ``tokenize`` (vLLM's ``POST /tokenize``, ``prompt`` or ``messages``) | ``render``
(``POST /v1/completions/render`` and ``/v1/chat/completions/render``); ``cacheSize`` 8192 (an LRU of prompts
→ token ids); ``maxTokens`` 262144 (a longer answer is an error); ``localTokenizer`` {``path`` "" (a HuggingFace
``tokenizer.json``: completions prompts are then tokenised in picker, in a worker thread, within the same
timeout; chat still asks the server, which applies its chat template), ``addSpecialTokens`` true} — needs the
``tokenizers`` package (``pip install picker[local-tokenizer]``).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator

from picker.plugins import PluginContext, PluginParams
from picker.scheduling import units
from picker.scheduling.spec import ConfiguredPlugin, PluginSpec

__all__ = ["KIND", "SPEC", "TYPE", "LocalTokenizer", "Params", "VLLMConfig"]

TYPE = "token-producer"
KIND = "token-producer"


class VLLMConfig(PluginParams):
    http: str = ""
    timeout: float = 0.1
    mm_timeout: float = 30.0  # accepted (multimodal)

    @field_validator("timeout", "mm_timeout", mode="before")
    @classmethod
    def _duration(cls, value: Any) -> float:
        return units.duration_s(value)

    @field_validator("http")
    @classmethod
    def _url(cls, value: str) -> str:
        if value and not value.startswith(("http://", "https://")):
            raise ValueError("vllm.http must be an http:// or https:// URL")
        return value.rstrip("/")


class LocalTokenizer(PluginParams):
    path: str = ""
    add_special_tokens: bool = True


class Params(PluginParams):
    model_name: str = ""
    vllm: VLLMConfig = Field(default_factory=VLLMConfig)
    api: Literal["tokenize", "render"] = "tokenize"
    cache_size: int = Field(default=8192, ge=0)
    max_tokens: int = Field(default=262_144, ge=1)
    local_tokenizer: LocalTokenizer = Field(default_factory=LocalTokenizer)


def _create(name: str, params: Params, ctx: PluginContext) -> ConfiguredPlugin:
    return ConfiguredPlugin(TYPE, name, params, KIND)


SPEC = PluginSpec(TYPE, Params, _create, kind=KIND)
