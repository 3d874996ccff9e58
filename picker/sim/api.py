"""OpenAI/vLLM wire shapes for the simulator: request parsing and response bodies (pure, no I/O).

Parsing is strict about types (a bad field is a 400 with an OpenAI-style error, never a crash) and lenient
about unknown fields (temperature, top_p, stop, ... are accepted and ignored, as a sampler-less sim must).
Defaults are vLLM's: ``max_tokens`` 16 for /v1/completions, "up to the context length" for chat.

Prefill/decode disaggregation (vLLM's ``kv_transfer_params``, NIXL connector shape): ``do_remote_decode: true``
makes the request a prefill for another server, answered with finish reason ``remote_decode`` and the
``kv_transfer_params`` a decode server needs (``remote_transfer_params``); ``do_remote_prefill: true`` makes it
the decode half: its prompt's KV is pulled, not computed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import orjson

from picker.sim.tokenizer import Tokenizer

__all__ = [
    "ApiError",
    "Kind",
    "ParsedRequest",
    "chunk",
    "completion_body",
    "error_body",
    "parse_generate",
    "remote_transfer_params",
    "render_chat",
    "usage",
]

Kind = Literal["chat", "completions"]
COMPLETIONS_DEFAULT_MAX_TOKENS = 16


class ApiError(Exception):
    """An HTTP error reply in OpenAI's shape."""

    def __init__(self, status: int, type_: str, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.type = type_
        self.message = message
        self.param = param

    @classmethod
    def bad(cls, message: str, param: str | None = None) -> ApiError:
        return cls(400, "BadRequestError", message, param)


def error_body(status: int, type_: str, message: str, param: str | None = None) -> bytes:
    return orjson.dumps({"error": {"message": message, "type": type_, "param": param, "code": status}})


@dataclass(frozen=True, slots=True)
class ParsedRequest:
    kind: Kind
    model: str
    prompt_ids: list[int]
    max_tokens: int | None
    min_tokens: int
    ignore_eos: bool
    stream: bool
    include_usage: bool
    remote_decode: bool = False  # kv_transfer_params.do_remote_decode: a prefill for another server
    remote_prefill: bool = False  # kv_transfer_params.do_remote_prefill: prefilled elsewhere, pull the KV


def render_chat(messages: Sequence[Mapping[str, str]]) -> str:
    """The simulator's chat template: ``role: content`` lines, then the assistant's turn."""
    return "".join(f"{m['role']}:{m['content']}\n" for m in messages) + "assistant:"


def _opt_int(body: Mapping[str, Any], key: str, minimum: int) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ApiError.bad(f"'{key}' must be an integer >= {minimum}", key)
    return value


def _opt_bool(body: Mapping[str, Any], key: str) -> bool:
    value = body.get(key, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise ApiError.bad(f"'{key}' must be a boolean", key)
    return value


def _messages(body: Mapping[str, Any]) -> list[dict[str, str]]:
    raw = body.get("messages")
    if not isinstance(raw, list) or not raw:
        raise ApiError.bad("'messages' must be a non-empty array", "messages")
    out: list[dict[str, str]] = []
    for m in raw:
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise ApiError.bad("each message needs a string 'role'", "messages")
        content = m.get("content")
        if content is None:
            content = ""
        elif isinstance(content, list):
            parts = []
            for part in content:
                if not isinstance(part, dict):
                    raise ApiError.bad("content parts must be objects", "messages")
                if part.get("type") == "text":
                    if not isinstance(part.get("text"), str):
                        raise ApiError.bad("a text part needs a string 'text'", "messages")
                    parts.append(part["text"])
            content = "".join(parts)
        elif not isinstance(content, str):
            raise ApiError.bad("message 'content' must be a string or an array of parts", "messages")
        out.append({"role": m["role"], "content": content})
    return out


def _prompt_ids(body: Mapping[str, Any], tokenizer: Tokenizer) -> list[int]:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str):
        if not prompt:
            raise ApiError.bad("'prompt' must not be empty", "prompt")
        return tokenizer.encode(prompt)
    if isinstance(prompt, list) and prompt and all(type(t) is int for t in prompt):
        if not all(0 <= t < tokenizer.vocab_size for t in prompt):
            raise ApiError.bad(f"token ids must be in [0, {tokenizer.vocab_size})", "prompt")
        return list(prompt)
    raise ApiError.bad("'prompt' must be a non-empty string or token-id array (batches are not supported)", "prompt")


def parse_generate(kind: Kind, body: object, tokenizer: Tokenizer, default_model: str) -> ParsedRequest:
    """Validate a /v1/completions or /v1/chat/completions body; raises ``ApiError``."""
    if not isinstance(body, dict):
        raise ApiError.bad("the request body must be a JSON object")
    model = body.get("model", default_model)
    if not isinstance(model, str) or not model:
        raise ApiError.bad("'model' must be a non-empty string", "model")
    n = body.get("n", 1)
    if n != 1 or isinstance(n, bool):
        raise ApiError.bad("only n=1 is supported", "n")
    if kind == "chat":
        prompt_ids = tokenizer.encode(render_chat(_messages(body)))
        max_tokens = _opt_int(body, "max_completion_tokens", 1)
        if max_tokens is None:
            max_tokens = _opt_int(body, "max_tokens", 1)
    else:
        prompt_ids = _prompt_ids(body, tokenizer)
        max_tokens = _opt_int(body, "max_tokens", 1)
        if "max_tokens" not in body:
            max_tokens = COMPLETIONS_DEFAULT_MAX_TOKENS
    min_tokens = _opt_int(body, "min_tokens", 0) or 0
    if max_tokens is not None and min_tokens > max_tokens:
        raise ApiError.bad("'min_tokens' must not exceed 'max_tokens'", "min_tokens")
    stream = _opt_bool(body, "stream")
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise ApiError.bad("'stream_options' must be an object", "stream_options")
    include_usage = _opt_bool(options, "include_usage") if options else False
    transfer = body.get("kv_transfer_params")
    if transfer is not None and not isinstance(transfer, dict):
        raise ApiError.bad("'kv_transfer_params' must be an object", "kv_transfer_params")
    remote_decode = _opt_bool(transfer, "do_remote_decode") if transfer else False
    remote_prefill = _opt_bool(transfer, "do_remote_prefill") if transfer else False
    if remote_decode and remote_prefill:
        raise ApiError.bad("do_remote_decode and do_remote_prefill are exclusive", "kv_transfer_params")
    return ParsedRequest(
        kind=kind,
        model=model,
        prompt_ids=prompt_ids,
        max_tokens=max_tokens,
        min_tokens=min_tokens,
        ignore_eos=_opt_bool(body, "ignore_eos"),
        stream=stream,
        include_usage=include_usage,
        remote_decode=remote_decode,
        remote_prefill=remote_prefill,
    )


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    }


def remote_transfer_params(
    engine_id: str, host: str, port: int, request_id: str, prompt_tokens: int, block_size: int
) -> dict[str, Any]:
    """What a prefill server answers for the decode server (vLLM NIXL's fields). The simulator moves no data:
    the block ids are the prompt's block positions."""
    return {
        "do_remote_prefill": True,
        "do_remote_decode": False,
        "remote_block_ids": list(range(-(-prompt_tokens // block_size))),
        "remote_engine_id": engine_id,
        "remote_host": host,
        "remote_port": port,
        "remote_request_id": request_id,
        "tp_size": 1,
    }


def completion_body(
    kind: Kind,
    rid: str,
    created: int,
    model: str,
    text: str,
    finish_reason: str,
    usage_: dict[str, Any],
    kv_transfer_params: dict[str, Any] | None = None,
) -> bytes:
    if kind == "chat":
        choice: dict[str, Any] = {
            "index": 0,
            "message": {"role": "assistant", "content": text},
            "logprobs": None,
            "finish_reason": finish_reason,
        }
        obj = "chat.completion"
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
        obj = "text_completion"
    doc = {"id": rid, "object": obj, "created": created, "model": model, "choices": [choice], "usage": usage_}
    if kv_transfer_params is not None:
        doc["kv_transfer_params"] = kv_transfer_params
    return orjson.dumps(doc)


def chunk(
    kind: Kind,
    rid: str,
    created: int,
    model: str,
    *,
    text: str | None = None,
    role: bool = False,
    finish_reason: str | None = None,
    usage_: dict[str, Any] | None = None,
) -> bytes:
    """One SSE event. ``usage_`` alone makes the final usage chunk (no choices)."""
    if usage_ is not None:
        choices: list[dict[str, Any]] = []
    elif kind == "chat":
        delta: dict[str, str] = {"role": "assistant", "content": ""} if role else {"content": text or ""}
        choices = [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}]
    else:
        choices = [{"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish_reason}]
    payload: dict[str, Any] = {
        "id": rid,
        "object": "chat.completion.chunk" if kind == "chat" else "text_completion",
        "created": created,
        "model": model,
        "choices": choices,
    }
    if usage_ is not None:
        payload["usage"] = usage_
    return b"data: " + orjson.dumps(payload) + b"\n\n"
