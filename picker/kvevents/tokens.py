"""Token ids for the precise prefix scorer: asked of the model server, cached, with a tight deadline.

``ServerTokenSource.token_ids(req, candidates)`` returns the prompt's token ids as the target server tokenises
it, or None (fail open: the precise scorer then scores with its approximate fallback). In order:

1. a completions ``prompt`` that already *is* token ids (a list of ints) is used as is;
2. an LRU cache of (target model, API, prompt) → ids (``cacheSize``; shared-prefix traffic repeats prompts);
3. with ``localTokenizer.path``, a completions prompt is tokenised in picker (HuggingFace ``tokenizers``, in a
   worker thread so the event loop never waits on it, within ``vllm.timeout``);
4. ``POST /tokenize`` (vLLM: ``{"model", "prompt"}`` or ``{"model", "messages", "add_generation_prompt": true}``,
   which applies the chat template) or, with ``api: render``, ``POST /v1/completions/render`` /
   ``/v1/chat/completions/render`` (the request body itself; answers carrying ``token_ids`` or
   ``prompt_token_ids``), on the configured ``vllm.http`` server, else on one of the candidates (chosen by the
   prompt's hash, so the same prompt asks the same server), within ``vllm.timeout``.

Answers are size-capped (``max_response_bytes``) and validated (``maxTokens`` ids in [0, 2^32)); anything else
is an error. Every outcome is counted in ``picker_tokenize_requests_total{outcome}``; failures are logged once
per failing streak, never with prompt text.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

import aiohttp
import orjson
import xxhash

from picker import errors
from picker.endpoints.model import Endpoint
from picker.request.model import ApiKind, InferenceRequest
from picker.scheduling.plugins.token_producer import Params
from picker.telemetry import kvmetrics

__all__ = ["ServerTokenSource"]

log = logging.getLogger(__name__)

_MAX_ID = 0xFFFF_FFFF


class TokenizeError(Exception):
    pass


class LocalTokenizer:
    """A HuggingFace ``tokenizer.json``, loaded once; raises ``errors.ConfigError`` if it cannot be."""

    def __init__(self, path: str, *, add_special_tokens: bool = True) -> None:
        try:
            from tokenizers import Tokenizer  # optional: picker[local-tokenizer]
        except ImportError as exc:
            raise errors.ConfigError(
                "token-producer localTokenizer needs the tokenizers package (pip install 'picker[local-tokenizer]')"
            ) from exc
        try:
            self._tokenizer = Tokenizer.from_file(path)
        except Exception as exc:  # tokenizers raises its own Exception subclass for unreadable files
            raise errors.ConfigError(f"token-producer localTokenizer: cannot load {path!r}: {exc}") from exc
        self.add_special_tokens = add_special_tokens

    def encode(self, text: str) -> tuple[int, ...]:
        return tuple(self._tokenizer.encode(text, add_special_tokens=self.add_special_tokens).ids)


class ServerTokenSource:
    def __init__(self, params: Params, *, max_response_bytes: int = 8 * 1024 * 1024) -> None:
        self.params = params
        self.timeout_s = params.vllm.timeout
        self.max_response_bytes = max_response_bytes
        self._cache: OrderedDict[bytes, tuple[int, ...]] = OrderedDict()
        self._session: aiohttp.ClientSession | None = None
        self._failing = False
        self._counts = {
            o: kvmetrics.TOKENIZE.labels(o)
            for o in ("cache", "server", "local", "prompt", "error", "timeout", "skipped")
        }
        local = params.local_tokenizer
        self.local = LocalTokenizer(local.path, add_special_tokens=local.add_special_tokens) if local.path else None

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def token_ids(self, req: InferenceRequest, candidates: Sequence[Endpoint]) -> Sequence[int] | None:
        body = req.body_json
        if body is None or req.api not in (ApiKind.COMPLETIONS, ApiKind.CHAT_COMPLETIONS):
            self._counts["skipped"].inc()
            return None
        if req.api is ApiKind.COMPLETIONS:
            given = _prompt_ids(body.get("prompt"))
            if given is not None:
                self._counts["prompt"].inc()
                return given
        key = xxhash.xxh3_128_digest(f"{req.target_model}\0{req.api.value}\0".encode() + req.prompt_text.encode())
        hit = self._cache.get(key)
        if hit is not None:
            self._cache.move_to_end(key)
            self._counts["cache"].inc()
            return hit
        prompt = body.get("prompt")
        text = prompt if isinstance(prompt, str) else ""
        local = self.local if req.api is ApiKind.COMPLETIONS and isinstance(prompt, str) else None
        if local is None and not candidates and not self.params.vllm.http:
            self._counts["skipped"].inc()
            return None
        try:
            if local is not None:
                ids = await asyncio.wait_for(asyncio.to_thread(local.encode, text), self.timeout_s)
            else:
                ids = await asyncio.wait_for(self._ask(req, body, candidates, key), self.timeout_s)
        except TimeoutError:
            self._fail("timeout", "tokenizer timed out")
            return None
        except (aiohttp.ClientError, TokenizeError, ValueError, OSError) as exc:
            self._fail("error", f"tokenizer failed: {type(exc).__name__}: {exc}")
            return None
        if self._failing:
            self._failing = False
            log.info("tokenizer answers again")
        self._counts["local" if local is not None else "server"].inc()
        if len(ids) > self.params.max_tokens:
            return None
        if self.params.cache_size:
            self._cache[key] = ids
            if len(self._cache) > self.params.cache_size:
                self._cache.popitem(last=False)
        return ids

    def _fail(self, outcome: str, message: str) -> None:
        self._counts[outcome].inc()
        if not self._failing:
            self._failing = True
            log.warning("%s; precise prefix scoring falls back to the approximate index until it recovers", message)

    async def _ask(
        self, req: InferenceRequest, body: Mapping[str, Any], candidates: Sequence[Endpoint], key: bytes
    ) -> tuple[int, ...]:
        base = self.params.vllm.http
        if not base:
            ep = candidates[int.from_bytes(key[:8], "big") % len(candidates)]
            host = f"[{ep.address}]" if ":" in ep.address else ep.address
            base = f"http://{host}:{ep.port}"
        chat = req.api is ApiKind.CHAT_COMPLETIONS
        if self.params.api == "render":
            url = f"{base}/v1/chat/completions/render" if chat else f"{base}/v1/completions/render"
            payload: Mapping[str, Any] = {**body, "model": req.target_model}
        else:
            url = f"{base}/tokenize"
            if chat:
                payload = {"model": req.target_model, "messages": body.get("messages"), "add_generation_prompt": True}
            else:
                payload = {"model": req.target_model, "prompt": body.get("prompt")}
        if self._session is None:
            self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=256))
        async with self._session.post(
            url, data=orjson.dumps(payload), headers={"content-type": "application/json"}
        ) as resp:
            if resp.status != 200:
                raise TokenizeError(f"HTTP {resp.status} from {url}")
            raw = await resp.content.read(self.max_response_bytes + 1)
        if len(raw) > self.max_response_bytes:
            raise TokenizeError("answer too large")
        return _ids_of(orjson.loads(raw), self.params.max_tokens)


def _prompt_ids(prompt: Any) -> tuple[int, ...] | None:
    if isinstance(prompt, list) and prompt and all(type(t) is int and 0 <= t <= _MAX_ID for t in prompt):
        return tuple(prompt)
    return None


def _ids_of(doc: Any, max_tokens: int) -> tuple[int, ...]:
    ids = None
    if isinstance(doc, dict):
        for field in ("tokens", "token_ids", "prompt_token_ids"):
            if field in doc:
                ids = doc[field]
                break
        else:  # a render answer may nest the engine prompt
            prompt = doc.get("engine_prompt") or doc.get("prompt")
            if isinstance(prompt, dict):
                ids = prompt.get("prompt_token_ids") or prompt.get("token_ids")
    if not isinstance(ids, list) or len(ids) > max_tokens:
        raise TokenizeError("no token ids in the answer")
    if not all(type(t) is int and 0 <= t <= _MAX_ID for t in ids):
        raise TokenizeError("token ids out of range")
    return tuple(ids)
