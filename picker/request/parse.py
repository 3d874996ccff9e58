"""Headers + body → ``InferenceRequest``, parsed once.

The body is decoded once with orjson and kept as the original bytes (``InferenceRequest.body``): it is never
re-serialised. Validation and messages follow the reference ``openai-parser`` (protocol.md §3, §7): first the
JSON itself, then the API's shape, then the model. Objectives are resolved to priorities later (the director);
here the priority stays 0.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import orjson

from picker import errors
from picker.request import apis
from picker.request import headers as hdr
from picker.request.model import ApiKind, InferenceRequest, Subset

__all__ = ["DEFAULT_FAIRNESS_ID", "DEFAULT_MAX_BODY_BYTES", "PARSERS", "parse_request", "request_id"]

DEFAULT_MAX_BODY_BYTES = 16 * 1024 * 1024
DEFAULT_FAIRNESS_ID = "default-flow"

# Parser names: picker's short names and the reference plugin types (EndpointPickerConfig ``parser.pluginRef``).
_OPENAI = frozenset({"openai", "openai-parser"})
_PASSTHROUGH = frozenset({"passthrough", "passthrough-parser"})
PARSERS: frozenset[str] = _OPENAI | _PASSTHROUGH

_PATH_HEADERS = (hdr.PATH, hdr.ORIGINAL_PATH, hdr.FORWARDED_PATH)
_MAX_TOKENS_KEYS = ("max_completion_tokens", "max_tokens", "max_output_tokens")


def parse_request(
    headers: Mapping[str, str],
    body: bytes,
    *,
    subset: Subset | None = None,
    parser: str = "openai",
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
) -> InferenceRequest:
    """Build the ``InferenceRequest`` of one HTTP request.

    ``headers`` are the request headers with lower-cased keys, pseudo-headers included (``:path`` may be absent).
    An empty body is a header-only request (``ApiKind.NONE``, model ""). Raises ``errors.PayloadTooLarge`` for
    a body over ``max_body_bytes`` and ``errors.BadRequest`` for a body the parser rejects; nothing else for
    any input. An unknown ``parser`` name is a programming error (``ValueError``).
    """
    if parser not in PARSERS:
        raise ValueError(f"unknown parser {parser!r}; known: {', '.join(sorted(PARSERS))}")
    if len(body) > max_body_bytes:
        raise errors.PayloadTooLarge(f"request body of {len(body)} bytes exceeds the limit of {max_body_bytes} bytes")
    rid = request_id(headers)
    objective = headers.get(hdr.OBJECTIVE) or None
    fairness_id = headers.get(hdr.FAIRNESS_ID) or DEFAULT_FAIRNESS_ID

    if not body or parser in _PASSTHROUGH:
        return InferenceRequest(
            request_id=rid,
            api=ApiKind.NONE,
            model="",
            target_model="",
            # Passthrough: nothing is parsed, but in-flight token accounting still wants a size.
            prompt_tokens=len(body) // 4,
            headers=headers,
            objective=objective,
            fairness_id=fairness_id,
            subset=subset,
            body=body,
        )

    doc = _decode(body)
    path = _path(headers)
    api = apis.api_from_path(path) if path is not None else apis.api_from_shape(doc)
    prompt_text, prompt_tokens = apis.extract_prompt(api, doc)
    model = doc.get("model")
    if not isinstance(model, str) or not model:
        raise errors.BadRequest("model not found in request body")
    max_tokens = _max_tokens(doc)
    return InferenceRequest(
        request_id=rid,
        api=api,
        model=model,
        target_model=model,
        prompt_text=prompt_text,
        prompt_tokens=prompt_tokens,
        max_tokens=max_tokens,
        fixed_output=max_tokens is not None and _fixed_output(doc, max_tokens),
        stream=doc.get("stream") is True,
        headers=headers,
        objective=objective,
        fairness_id=fairness_id,
        subset=subset,
        body=body,
        body_json=doc,
    )


def request_id(headers: Mapping[str, str]) -> str:
    """``x-request-id`` looked up case-insensitively; a new UUIDv4 when absent or empty."""
    value = headers.get(hdr.REQUEST_ID)
    if value is None:
        size = len(hdr.REQUEST_ID)
        for key, v in headers.items():
            if len(key) == size and key.lower() == hdr.REQUEST_ID:
                value = v
                break
    return value or new_request_id()


def new_request_id() -> str:
    """A random UUIDv4 in its text form, as ``str(uuid.uuid4())`` (same randomness) at half the cost: one per
    request that came without an id."""
    h = os.urandom(16).hex()
    return f"{h[:8]}-{h[8:12]}-4{h[13:16]}-{_VARIANT[int(h[16], 16) & 3]}{h[17:20]}-{h[20:]}"


_VARIANT = "89ab"  # RFC 4122 variant: the 17th hex digit is 10xx


def _decode(body: bytes) -> dict[str, Any]:
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise errors.BadRequest(f"error unmarshaling request bodyMap: {exc}") from exc
    if not isinstance(doc, dict):
        raise errors.BadRequest(f"error unmarshaling request bodyMap: expected a JSON object, got {_json_type(doc)}")
    return doc


def _json_type(value: Any) -> str:
    if isinstance(value, list):
        return "an array"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, bool):
        return "a boolean"
    if value is None:
        return "null"
    return "a number"


def _path(headers: Mapping[str, str]) -> str | None:
    for name in _PATH_HEADERS:
        value = headers.get(name)
        if value:
            return value
    return None


def _fixed_output(doc: Mapping[str, Any], max_tokens: int) -> bool:
    """Whether the answer is exactly ``max_tokens`` long: ``ignore_eos``, or ``min_tokens`` >= ``max_tokens``."""
    if doc.get("ignore_eos") is True:
        return True
    low = doc.get("min_tokens")
    return isinstance(low, int) and not isinstance(low, bool) and low >= max_tokens


def _max_tokens(doc: Mapping[str, Any]) -> int | None:
    for key in _MAX_TOKENS_KEYS:
        value = doc.get(key)
        if isinstance(value, bool):
            continue
        if isinstance(value, int) and value >= 0:
            return value
        if isinstance(value, float) and value.is_integer() and value >= 0:
            return int(value)
    return None
