"""A routing sidecar in front of a decode server: llm-d's ``pd-sidecar`` (NIXL v2 connector), for the simulator.

In llm-d the gateway sends a request to the decode pod's port, where this sidecar listens in front of vLLM. picker
(the EPP) chose the decode pod and, for a disaggregated request, named the prefill pod in
``x-prefiller-host-port``. The sidecar then, for ``/v1/completions`` and ``/v1/chat/completions``:

1. no ``x-prefiller-host-port`` (or an empty one): proxies the request to the decode server unchanged;
2. a prefiller not in the allowlist: answers 403 (llm-d's SSRF protection: only the pool's pods may be named);
3. else sends the prefill first: the same body with ``kv_transfer_params`` = ``{do_remote_decode: true,
   do_remote_prefill: false, remote_engine_id / remote_block_ids / remote_host / remote_port: null}``, ``stream``
   false, no ``stream_options``, ``max_tokens`` 1 (and ``max_completion_tokens`` 1 for chat), no ``min_tokens``,
   a fresh ``x-request-id``, to ``http://<prefiller><path>``. (llm-d leaves ``min_tokens`` in, and vLLM refuses
   ``min_tokens`` > ``max_tokens`` with a 400: a request asking for a minimum length could not be
   disaggregated.) A prefill answered with an error status is relayed as is; a prefiller that cannot be reached
   is a 502;
4. then sends the original request (its ``stream``, ``stream_options`` and token limits restored) with the
   prefiller's ``kv_transfer_params`` to the decode server, and streams its answer back.

The first header value is used when several are given (comma-separated or repeated), as llm-d does without
prefiller sampling. Every other path (``/metrics``, ``/health``, ``/v1/models``, ...) is proxied to the decode
server, so picker scrapes the decode server through the sidecar's port, as it scrapes the pod's port in llm-d.
Bodies are capped (``max_body_bytes``, 413); responses are streamed through chunk by chunk.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson
from aiohttp import web
from multidict import CIMultiDict

from picker.sim import api

__all__ = ["PREFILLER_HEADER", "RoutingSidecar", "SidecarConfig", "prefill_body"]

log = logging.getLogger(__name__)

PREFILLER_HEADER = "x-prefiller-host-port"
_GENERATE_PATHS = ("/v1/completions", "/v1/chat/completions")
# Not forwarded in either direction (RFC 9110 hop-by-hop, plus what aiohttp recomputes).
_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
    }
)


@dataclass(frozen=True, slots=True)
class SidecarConfig:
    decoder_url: str  # the decode server behind the sidecar, e.g. http://127.0.0.1:8001
    host: str = "127.0.0.1"
    port: int = 8000  # 0: any free port (see RoutingSidecar.port after start)
    # host:port a request may name as its prefiller; None allows any (a local try only: anyone who can reach the
    # sidecar could make it send requests anywhere).
    allowed_prefillers: frozenset[str] | None = frozenset()
    max_body_bytes: int = 8 * 1024 * 1024
    timeout_s: float = 600.0
    name: str | None = None


def prefill_body(doc: Mapping[str, Any], path: str) -> dict[str, Any]:
    """The prefill request llm-d's NIXL v2 connector sends for ``doc``."""
    out = dict(doc)
    out["kv_transfer_params"] = {
        "do_remote_decode": True,
        "do_remote_prefill": False,
        "remote_engine_id": None,
        "remote_block_ids": None,
        "remote_host": None,
        "remote_port": None,
    }
    out["stream"] = False
    out.pop("stream_options", None)
    out["max_tokens"] = 1
    out.pop("min_tokens", None)
    if path.endswith("/chat/completions"):
        out["max_completion_tokens"] = 1
    return out


class RoutingSidecar:
    """One sidecar: an aiohttp server on ``config.port`` in front of ``config.decoder_url``."""

    def __init__(self, config: SidecarConfig) -> None:
        self.config = config
        self._port = config.port
        self._decoder = config.decoder_url.rstrip("/")
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None
        self.prefills = 0  # requests sent to a prefiller first
        self.passthrough = 0  # generate requests proxied as they came (no prefiller named)
        self.refused = 0  # prefillers outside the allowlist
        app = web.Application(client_max_size=config.max_body_bytes)
        for path in _GENERATE_PATHS:
            app.router.add_post(path, self._generate)
        app.router.add_route("*", "/{tail:.*}", self._proxy)
        self.app = app

    @property
    def port(self) -> int:
        return self._port

    @property
    def name(self) -> str:
        return self.config.name or f"sidecar-{self._port}"

    @property
    def url(self) -> str:
        host = self.config.host if self.config.host not in ("0.0.0.0", "::") else "127.0.0.1"
        return f"http://{host}:{self._port}"

    async def start(self) -> None:
        timeout = aiohttp.ClientTimeout(total=self.config.timeout_s)
        self._session = aiohttp.ClientSession(timeout=timeout, auto_decompress=False)
        self._runner = web.AppRunner(self.app, access_log=None, handler_cancellation=True, shutdown_timeout=1.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.config.host, self._port, reuse_address=True)
        await site.start()
        if self._port == 0:
            self._port = self._runner.addresses[-1][1]

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def __aenter__(self) -> RoutingSidecar:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # -- handlers ---------------------------------------------------------------------------------------------

    async def _generate(self, request: web.Request) -> web.StreamResponse:
        body = await self._read(request)
        prefiller = _first(request.headers.getall(PREFILLER_HEADER, []))
        if not prefiller:
            self.passthrough += 1
            return await self._forward(request, self._decoder + request.path_qs, body, _upstream_headers(request))
        allowed = self.config.allowed_prefillers
        if allowed is not None and prefiller not in allowed:
            self.refused += 1
            log.warning("%s: prefill target %s is not in the allowlist: refused", self.name, prefiller)
            return _error(403, "Forbidden", "prefill target not allowed by SSRF protection")
        try:
            doc = orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            return _error(400, "BadRequestError", f"malformed JSON: {exc}")
        if not isinstance(doc, dict):
            return _error(400, "BadRequestError", "the request body must be a JSON object")
        self.prefills += 1
        params = await self._prefill(request, prefiller, doc)
        if isinstance(params, web.Response):
            return params
        decode = dict(doc)
        decode["kv_transfer_params"] = params
        headers = _upstream_headers(request)
        headers["x-request-id"] = str(uuid.uuid4())
        return await self._forward(request, self._decoder + request.path_qs, orjson.dumps(decode), headers)

    async def _prefill(self, request: web.Request, prefiller: str, doc: dict[str, Any]) -> Any:
        """POST the prefill; its ``kv_transfer_params`` (None if it sent none), or the error reply to send."""
        assert self._session is not None
        headers = _upstream_headers(request)
        headers["x-request-id"] = str(uuid.uuid4())
        url = f"http://{prefiller}{request.path_qs}"
        try:
            async with self._session.post(
                url, data=orjson.dumps(prefill_body(doc, request.path)), headers=headers
            ) as resp:
                payload = await resp.content.read(self.config.max_body_bytes + 1)
                if not 200 <= resp.status < 300:
                    log.warning("%s: prefill at %s failed with %d", self.name, prefiller, resp.status)
                    return web.Response(status=resp.status, body=payload, content_type="application/json")
        except (aiohttp.ClientError, TimeoutError) as exc:
            log.warning("%s: prefill at %s failed: %s", self.name, prefiller, exc)
            return _error(502, "BadGateway", f"prefill at {prefiller} failed: {type(exc).__name__}")
        try:
            answer = orjson.loads(payload)
        except orjson.JSONDecodeError:
            return _error(502, "BadGateway", f"prefill at {prefiller} answered with malformed JSON")
        params = answer.get("kv_transfer_params") if isinstance(answer, dict) else None
        if params is None:
            log.warning("%s: prefill at %s answered without kv_transfer_params", self.name, prefiller)
        return params

    async def _proxy(self, request: web.Request) -> web.StreamResponse:
        body = await self._read(request) if request.can_read_body else b""
        return await self._forward(request, self._decoder + request.path_qs, body, _upstream_headers(request))

    async def _read(self, request: web.Request) -> bytes:
        limit = self.config.max_body_bytes
        if request.content_length is not None and request.content_length > limit:
            raise web.HTTPRequestEntityTooLarge(max_size=limit, actual_size=request.content_length)
        return await request.read()

    async def _forward(
        self, request: web.Request, url: str, body: bytes, headers: CIMultiDict[str]
    ) -> web.StreamResponse:
        """Send ``body`` to ``url`` and stream the answer back to the client."""
        assert self._session is not None
        resp: web.StreamResponse | None = None
        try:
            async with self._session.request(request.method, url, data=body or None, headers=headers) as upstream:
                resp = web.StreamResponse(status=upstream.status, headers=_downstream_headers(upstream.headers))
                await resp.prepare(request)
                async for chunk in upstream.content.iter_any():
                    await resp.write(chunk)
                await resp.write_eof()
                return resp
        except (aiohttp.ClientError, TimeoutError) as exc:
            log.warning("%s: decode server %s failed: %s", self.name, self._decoder, exc)
            if resp is not None:  # mid-answer: cut the connection, as the decode server's failure did
                if request.transport is not None:
                    request.transport.abort()
                raise web.HTTPBadGateway() from exc
            return _error(502, "BadGateway", f"decode server failed: {type(exc).__name__}")


def _first(values: Iterable[str]) -> str:
    """The first host:port of the header (one value per line, or comma-separated in one)."""
    for value in values:
        for part in value.split(","):
            if part.strip():
                return part.strip()
    return ""


def _upstream_headers(request: web.Request) -> CIMultiDict[str]:
    return CIMultiDict(
        (k, v) for k, v in request.headers.items() if k.lower() not in _HOP and k.lower() != PREFILLER_HEADER
    )


def _downstream_headers(headers: Mapping[str, str]) -> CIMultiDict[str]:
    return CIMultiDict((k, v) for k, v in headers.items() if k.lower() not in _HOP)


def _error(status: int, type_: str, message: str) -> web.Response:
    return web.Response(status=status, body=api.error_body(status, type_, message), content_type="application/json")
