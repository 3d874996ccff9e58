"""OpenAI API shapes: which API a request is, whether its body has the shape that API needs, and its prompt text.

The API kind comes from the request path by suffix (reference ``openai-parser``); a path that matches none is a
completions request (the reference's default). A request without any path header (NGINX Gateway Fabric's shim
sends none) is classified by the body's shape instead.

The prompt text is what the prefix index hashes (scheduling.md §4): completions → the prompt (a list of strings
joined by spaces); chat → JSON of ``messages``; responses → JSON of ``[{instructions}, {tools}, {input}]`` (the
first two only when present); conversations → JSON of ``items``; embeddings → JSON of ``input``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from picker import errors
from picker.request.model import ApiKind

__all__ = ["Prompt", "api_from_path", "api_from_shape", "estimate_tokens", "extract_prompt"]

# Checked in this order: "/chat/completions" also ends with "/completions".
_SUFFIXES: tuple[tuple[str, ApiKind], ...] = (
    ("/conversations", ApiKind.CONVERSATIONS),
    ("/responses", ApiKind.RESPONSES),
    ("/chat/completions", ApiKind.CHAT_COMPLETIONS),
    ("/chat/completions/render", ApiKind.CHAT_COMPLETIONS),
    ("/completions", ApiKind.COMPLETIONS),
    ("/completions/render", ApiKind.COMPLETIONS),
    ("/embeddings", ApiKind.EMBEDDINGS),
)

# Body keys that only the Responses API has (an "input" body with one of them is a Responses request).
_RESPONSES_KEYS = frozenset(
    {
        "instructions",
        "tools",
        "previous_response_id",
        "max_output_tokens",
        "reasoning",
        "text",
        "conversation",
        "store",
        "background",
        "include",
        "truncation",
    }
)

_SHAPE_ERRORS: Mapping[ApiKind, str] = {
    ApiKind.CHAT_COMPLETIONS: "invalid chat completions request: must have valid messages field",
    ApiKind.COMPLETIONS: "invalid completions request: must have prompt field",
    ApiKind.RESPONSES: "invalid responses request: must have input field",
    ApiKind.CONVERSATIONS: "invalid conversations request: must have items field",
    ApiKind.EMBEDDINGS: "invalid embeddings request: must have input field",
}

Prompt = tuple[str, int]  # (prompt text, prompt tokens: estimated from the text, or exact for token-id prompts)


def api_from_path(path: str) -> ApiKind:
    """The API kind of a request path (query string ignored); unmatched paths are completions."""
    cut = path.find("?")
    if cut >= 0:
        path = path[:cut]
    path = path.rstrip("/")
    for suffix, kind in _SUFFIXES:
        if path.endswith(suffix):
            return kind
    return ApiKind.COMPLETIONS


def api_from_shape(doc: Mapping[str, Any]) -> ApiKind:
    """The API kind of a body when the request carries no path."""
    if "messages" in doc:
        return ApiKind.CHAT_COMPLETIONS
    if "prompt" in doc:
        return ApiKind.COMPLETIONS
    if "items" in doc:
        return ApiKind.CONVERSATIONS
    if "input" in doc:
        if not _RESPONSES_KEYS.isdisjoint(doc):
            return ApiKind.RESPONSES
        return ApiKind.EMBEDDINGS
    return ApiKind.COMPLETIONS  # the reference's default: fails below with "must have prompt field"


def extract_prompt(api: ApiKind, doc: Mapping[str, Any]) -> Prompt:
    """Validate ``doc`` against ``api``'s shape and return its prompt text and token estimate.

    Raises ``errors.BadRequest`` with the reference's message when the shape is wrong.
    """
    text: str | None
    tokens = -1
    if api is ApiKind.CHAT_COMPLETIONS:
        messages = doc.get("messages")
        text = _json(messages) if _valid_messages(messages) else None
    elif api is ApiKind.COMPLETIONS:
        text, tokens = _completions_prompt(doc.get("prompt"))
    elif api is ApiKind.EMBEDDINGS:
        value = doc.get("input")
        text = _json(value) if _non_empty(value) else None
    elif api is ApiKind.RESPONSES:
        text = _responses_text(doc)
    elif api is ApiKind.CONVERSATIONS:
        items = doc.get("items")
        text = _json(items) if isinstance(items, list) and items else None
    else:
        return "", 0
    if text is None:
        raise errors.BadRequest(_SHAPE_ERRORS[api])
    if tokens < 0:
        tokens = estimate_tokens(text)
    return text, tokens


def estimate_tokens(text: str) -> int:
    """Characters / 4, at least 1 for any text (the reference's estimate)."""
    return max(1, len(text) // 4) if text else 0


def _json(value: Any) -> str:
    return orjson.dumps(value).decode()


def _non_empty(value: Any) -> bool:
    return (isinstance(value, str | list) and len(value) > 0) or isinstance(value, dict)


def _valid_messages(messages: Any) -> bool:
    if not isinstance(messages, list) or not messages:
        return False
    for message in messages:
        if not isinstance(message, dict):
            return False
        role = message.get("role")
        if role is not None and not isinstance(role, str):
            return False
        content = message.get("content")
        if content is not None and not isinstance(content, str | list):
            return False
    return True


def _completions_prompt(prompt: Any) -> tuple[str | None, int]:
    if isinstance(prompt, str):
        return (prompt, -1) if prompt else (None, -1)
    if not isinstance(prompt, list) or not prompt:
        return None, -1
    if all(isinstance(p, str) for p in prompt):
        return " ".join(prompt), -1
    if all(isinstance(p, int) and not isinstance(p, bool) for p in prompt):
        return _json(prompt), len(prompt)  # token ids: the count is exact
    if all(isinstance(p, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in p) for p in prompt):
        return _json(prompt), sum(len(p) for p in prompt)
    return None, -1


def _responses_text(doc: Mapping[str, Any]) -> str | None:
    value = doc.get("input")
    if value is None:
        return None
    combined: list[dict[str, Any]] = []
    instructions = doc.get("instructions")
    if instructions is not None:
        combined.append({"instructions": instructions})
    tools = doc.get("tools")
    if tools is not None:
        combined.append({"tools": tools})
    combined.append({"input": value})
    return _json(combined)
