"""P/D deciders (llm-d): whether a request, already given its decode endpoint, is prefilled elsewhere.

A disaggregation profile handler (``disagg_handler``) runs the ``decode`` profile first, then asks its decider
whether to run the ``prefill`` profile for the chosen decode endpoint. A decider is a plugin with one method,
``decide(req, decode_endpoint, cycle) -> bool`` (``Decider``). Types:

* ``prefix-based-pd-decider`` (llm-d), parameters ``nonCachedTokens`` N (0) and ``promptTokens`` P (0). N = 0
  disables it (decode-only, as llm-d ≥ 0.9; its older releases read 0 as "always"). Else, with input tokens =
  prompt bytes / 4 (chat: the JSON of the messages, as picker's prompt text is), disaggregate iff input ≥ P
  (when P > 0), input ≥ N, and the part of the prompt the decode endpoint does not hold is ≥ N tokens. What the
  decode endpoint holds comes from the prefix plugin that scored the decode profile (the ``PrefixMatch`` it left
  in the ``CycleState``): matched blocks x block characters / 4. Without a prefix plugin in the decode profile
  there is no match to read: decode-only, as llm-d does (logged once).
* ``always-disagg-pd-decider`` (llm-d): always disaggregate. No parameters.
* ``prompt-length-pd-decider`` (picker's): disaggregate iff the prompt is at least ``minPromptTokens``
  (1024) tokens (picker's token estimate of the prompt), whatever is cached: a long prefill would stall the
  decode endpoint's batch, a short one costs less than the KV transfer and the extra hop.
* ``always-disagg-multimodal-decider`` (llm-d, for the ``encode`` stage): true iff a chat message has an
  ``image_url``, ``video_url`` or ``input_audio`` content part. No parameters.
"""

from __future__ import annotations

import logging
from typing import ClassVar, Protocol, runtime_checkable

from pydantic import Field

from picker.plugins import CycleState, Endpoint, InferenceRequest, NoParams, PluginContext, PluginParams
from picker.scheduling.plugins.prefix import MATCH_STATE, PrefixMatch
from picker.scheduling.spec import PluginSpec

__all__ = [
    "ALWAYS",
    "ALWAYS_SPEC",
    "CHARS_PER_TOKEN",
    "MULTIMODAL",
    "MULTIMODAL_SPEC",
    "PROMPT_LENGTH",
    "PROMPT_LENGTH_SPEC",
    "SPEC",
    "TYPE",
    "AlwaysDecider",
    "Decider",
    "MultimodalDecider",
    "Params",
    "PrefixBasedDecider",
    "PromptLengthDecider",
    "PromptLengthParams",
    "create",
    "input_tokens",
]

log = logging.getLogger(__name__)

TYPE = "prefix-based-pd-decider"
ALWAYS = "always-disagg-pd-decider"
PROMPT_LENGTH = "prompt-length-pd-decider"
MULTIMODAL = "always-disagg-multimodal-decider"
CHARS_PER_TOKEN = 4  # llm-d's AverageCharactersPerToken
_MEDIA_PARTS = frozenset({"image_url", "video_url", "input_audio"})


@runtime_checkable
class Decider(Protocol):
    """Whether to run the next disaggregation stage for a request whose decode endpoint is chosen."""

    name: str

    def decide(self, req: InferenceRequest, decode: Endpoint, cycle: CycleState) -> bool: ...


def input_tokens(req: InferenceRequest) -> int:
    """llm-d's estimate of the prompt's tokens: its UTF-8 bytes / 4."""
    text = req.prompt_text
    return (len(text) if text.isascii() else len(text.encode())) // CHARS_PER_TOKEN


class Params(PluginParams):
    non_cached_tokens: int = Field(default=0, ge=0)
    prompt_tokens: int = Field(default=0, ge=0)


class PrefixBasedDecider:
    type: ClassVar[str] = TYPE
    __slots__ = ("_warned", "name", "non_cached_tokens", "prompt_tokens")

    def __init__(self, name: str, non_cached_tokens: int, prompt_tokens: int = 0) -> None:
        self.name = name
        self.non_cached_tokens = non_cached_tokens
        self.prompt_tokens = prompt_tokens
        self._warned = False
        if non_cached_tokens == 0:
            log.info("%s (%s): nonCachedTokens is 0: prefill/decode disaggregation disabled", name, TYPE)

    def decide(self, req: InferenceRequest, decode: Endpoint, cycle: CycleState) -> bool:
        threshold = self.non_cached_tokens
        if threshold == 0:
            return False
        tokens = input_tokens(req)
        if tokens < threshold or tokens < self.prompt_tokens:
            return False
        match = cycle.get(MATCH_STATE)
        if not isinstance(match, PrefixMatch):
            if not self._warned:
                self._warned = True
                log.warning(
                    "%s (%s): no prefix match in the decode profile (add a prefix-cache-scorer to it); "
                    "requests are served decode-only",
                    self.name,
                    TYPE,
                )
            return False
        hit_tokens = match.blocks.get(decode.key, 0) * match.block_chars // CHARS_PER_TOKEN
        return tokens - hit_tokens >= threshold


class AlwaysDecider:
    type: ClassVar[str] = ALWAYS
    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def decide(self, req: InferenceRequest, decode: Endpoint, cycle: CycleState) -> bool:
        return True


class PromptLengthParams(PluginParams):
    min_prompt_tokens: int = Field(default=1024, ge=0)


class PromptLengthDecider:
    type: ClassVar[str] = PROMPT_LENGTH
    __slots__ = ("min_prompt_tokens", "name")

    def __init__(self, name: str, min_prompt_tokens: int) -> None:
        self.name = name
        self.min_prompt_tokens = min_prompt_tokens

    def decide(self, req: InferenceRequest, decode: Endpoint, cycle: CycleState) -> bool:
        return req.prompt_tokens >= self.min_prompt_tokens


class MultimodalDecider:
    type: ClassVar[str] = MULTIMODAL
    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def decide(self, req: InferenceRequest, decode: Endpoint, cycle: CycleState) -> bool:
        doc = req.body_json
        messages = doc.get("messages") if doc is not None else None
        if not isinstance(messages, list):
            return False
        for message in messages:
            content = message.get("content") if isinstance(message, dict) else None
            if isinstance(content, list):
                for part in content:
                    if isinstance(part, dict) and part.get("type") in _MEDIA_PARTS:
                        return True
        return False


def create(name: str, params: Params, ctx: PluginContext) -> Decider:
    return PrefixBasedDecider(name, params.non_cached_tokens, params.prompt_tokens)


def _always(name: str, params: NoParams, ctx: PluginContext) -> Decider:
    return AlwaysDecider(name)


def _prompt_length(name: str, params: PromptLengthParams, ctx: PluginContext) -> Decider:
    return PromptLengthDecider(name, params.min_prompt_tokens)


def _multimodal(name: str, params: NoParams, ctx: PluginContext) -> Decider:
    return MultimodalDecider(name)


SPEC = PluginSpec(TYPE, Params, create)
ALWAYS_SPEC = PluginSpec(ALWAYS, NoParams, _always)
PROMPT_LENGTH_SPEC = PluginSpec(PROMPT_LENGTH, PromptLengthParams, _prompt_length)
MULTIMODAL_SPEC = PluginSpec(MULTIMODAL, NoParams, _multimodal)
