"""InferenceRequest: everything picker learns from one request, parsed once."""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

__all__ = ["ApiKind", "InferenceRequest", "Subset"]

_EMPTY: Mapping[str, str] = MappingProxyType({})


class ApiKind(enum.Enum):
    CHAT_COMPLETIONS = "chat/completions"
    COMPLETIONS = "completions"
    RESPONSES = "responses"
    CONVERSATIONS = "conversations"
    EMBEDDINGS = "embeddings"
    NONE = "none"  # header-only request (no body), or the passthrough parser


@dataclass(frozen=True, slots=True)
class Subset:
    """The proxy's subset hint: ``ip`` admits every port of that IP, ``ip:port`` exactly that endpoint."""

    addresses: frozenset[str] = frozenset()  # bare IPs
    hostports: frozenset[str] = frozenset()  # "ip:port" keys

    def admits(self, key: str, address: str) -> bool:
        return key in self.hostports or address in self.addresses

    @property
    def empty(self) -> bool:
        return not self.addresses and not self.hostports


@dataclass(frozen=True, slots=True)
class InferenceRequest:
    request_id: str
    api: ApiKind
    model: str  # as the client sent it ("" for a header-only request)
    target_model: str  # after any rewrite; equals ``model`` otherwise
    prompt_text: str = ""  # the text used for prefix hashing (reference rules per API kind)
    prompt_tokens: int = 0  # estimate (or exact, if tokenised) of the prompt length in tokens
    max_tokens: int | None = None
    # The answer's length is fixed at ``max_tokens`` (``ignore_eos``, or ``min_tokens`` >= ``max_tokens``).
    fixed_output: bool = False
    stream: bool = False
    headers: Mapping[str, str] = field(default_factory=lambda: _EMPTY)  # lower-cased keys, control headers included
    objective: str | None = None  # x-gateway-inference-objective
    fairness_id: str = "default-flow"
    priority: int = 0
    subset: Subset | None = None  # None: no hint, all endpoints are candidates
    body: bytes = b""  # the body to send upstream (original bytes unless the model was rewritten)
    body_json: Mapping[str, Any] | None = field(default=None, compare=False, repr=False)
    # The prompt's token ids as the target model server tokenises it, when a token source looked them up before
    # scheduling (the precise prefix scorer needs them); None: not looked up, or the lookup failed.
    token_ids: Sequence[int] | None = field(default=None, compare=False, repr=False)

    @property
    def lora_adapter(self) -> str:
        """The adapter (or base model) name a LoRA-aware scorer matches: the target model."""
        return self.target_model
