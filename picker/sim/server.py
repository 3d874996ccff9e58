"""The vLLM-compatible HTTP server around one engine (aiohttp).

Endpoints: ``/v1/completions``, ``/v1/chat/completions`` (JSON or SSE, one token per chunk), ``/v1/models``,
``/tokenize``, ``/detokenize``, ``/reset_prefix_cache``, ``/health``, ``/metrics``; and the simulator's own
``/admin/faults`` (GET/POST), ``/admin/crash`` (POST ``{"down_s": seconds|null}``) and ``/admin/stats`` (GET).

Every response carries ``x-backend: <name>`` (and ``x-inference-pod``/``-namespace``/``-port`` when configured),
so a client behind a gateway sees which server answered. Errors are OpenAI-shaped JSON; malformed input is a
400 and an oversized body a 413, never a crash. Several servers can share one process and one event loop
(``cli.py`` runs ``--count N``), each with its own engine, driver task, fault injector and metrics registry.

With ``ServerConfig.kv_events`` the engine's KV-cache events go out on vLLM's ZeroMQ wire after every step
(``kvevents.py``), topic ``kv@<topic_host>:<port>@<model>``; a crash restarts the stream at sequence 0 (a new
process), as a restarted vLLM does.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, NoReturn

import orjson
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

from picker.sim import api
from picker.sim.config import EngineConfig
from picker.sim.driver import EngineDriver, RequestHandle
from picker.sim.engine import Engine, RequestRejected, SimRequest
from picker.sim.faults import Crash, ErrorReply, FaultInjector, Faults, Hang
from picker.sim.kvevents import KVEventPublisher
from picker.sim.metrics import SimMetrics
from picker.sim.tokenizer import Tokenizer, default_tokenizer

__all__ = ["KVEventsOptions", "ServerConfig", "SimServer"]

log = logging.getLogger(__name__)

_REJECT_STATUS = {
    "queue_full": (429, "RateLimitError"),
    "too_long": (400, "BadRequestError"),
    "unknown_model": (404, "NotFoundError"),
    "bad_request": (400, "BadRequestError"),
}
_Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
REMOTE_DECODE = "remote_decode"  # the finish reason of a prefill served for another server


@dataclass(frozen=True, slots=True)
class KVEventsOptions:
    """Publish KV-cache events: ``port`` binds a PUB socket there (0: any free port), or ``zmq_endpoint`` dials
    a router that binds (central mode); ``replay_port`` also serves replays (0: any free port)."""

    port: int | None = None
    zmq_endpoint: str | None = None
    replay_port: int | None = None
    topic_host: str = "127.0.0.1"  # the IP picker knows this server by (vLLM: $POD_IP)
    batch_size: int = 16
    map_format: bool = False
    dp_rank: int | None = None

    def __post_init__(self) -> None:
        if (self.port is None) == (self.zmq_endpoint is None):
            raise ValueError("KV events need exactly one of a port to bind and a ZMQ endpoint to dial")


@dataclass(frozen=True, slots=True)
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 8000  # 0: any free port (see SimServer.port after start)
    name: str | None = None  # x-backend header; default "sim-<port>"
    max_body_bytes: int = 8 * 1024 * 1024
    faults: Faults = field(default_factory=Faults)
    fault_seed: int = 0
    legacy_metric_names: bool = False
    pod_name: str | None = None
    pod_namespace: str | None = None
    shutdown_timeout_s: float = 1.0
    kv_events: KVEventsOptions | None = None
    startup_s: float = 0.0  # cold start: the port opens only after this long


class SimServer:
    """One simulated vLLM server: engine + real-time driver + aiohttp app on one port."""

    def __init__(
        self, engine_config: EngineConfig, config: ServerConfig | None = None, *, tokenizer: Tokenizer | None = None
    ) -> None:
        self.config = config or ServerConfig()
        self.tokenizer = tokenizer or default_tokenizer()
        self.engine = Engine(engine_config, self.tokenizer)
        self.injector = FaultInjector(self.config.faults, seed=self.config.fault_seed)
        self.metrics = SimMetrics(
            self.engine, driver_lag_s=lambda: self.driver.max_lag_s, legacy_names=self.config.legacy_metric_names
        )
        self.kv_publisher: KVEventPublisher | None = None
        self.driver = EngineDriver(
            self.engine,
            on_updates=self.metrics.record,
            stall_s=self.injector.step_stall_s,
            on_step=self._publish_kv_events if self.config.kv_events is not None else None,
        )
        self.crashed = False
        self.crashes = 0
        self._port = self.config.port
        self._runner: web.AppRunner | None = None
        self._site: web.TCPSite | None = None
        self._driver_task: asyncio.Task[None] | None = None
        self._restart_task: asyncio.Task[None] | None = None
        self._crash_task: asyncio.Task[None] | None = None
        self._headers: dict[str, str] = {}
        self.app = self._build_app()

    # -- lifecycle --------------------------------------------------------------------------------------------

    @property
    def port(self) -> int:
        return self._port

    @property
    def name(self) -> str:
        return self.config.name or f"sim-{self._port}"

    @property
    def url(self) -> str:
        host = self.config.host if self.config.host not in ("0.0.0.0", "::") else "127.0.0.1"
        return f"http://{host}:{self._port}"

    async def start(self) -> None:
        if self.config.startup_s:
            # A cold start: vLLM opens its port only once the model is loaded.
            log.warning("%s: cold start, port opens in %s s", self.name, self.config.startup_s)
            await asyncio.sleep(self.config.startup_s)
        self._runner = web.AppRunner(
            self.app, access_log=None, handler_cancellation=True, shutdown_timeout=self.config.shutdown_timeout_s
        )
        await self._runner.setup()
        await self._listen()
        await self._start_kv_events()
        self._driver_task = asyncio.create_task(self.driver.run(), name=f"sim-driver-{self._port}")
        self._headers = {"x-backend": self.name}
        if self.config.pod_name:
            self._headers["x-inference-pod"] = self.config.pod_name
            self._headers["x-inference-port"] = str(self._port)
        if self.config.pod_namespace:
            self._headers["x-inference-namespace"] = self.config.pod_namespace

    async def _listen(self) -> None:
        assert self._runner is not None
        self._site = web.TCPSite(self._runner, self.config.host, self._port, reuse_address=True)
        await self._site.start()
        if self._port == 0:
            self._port = self._runner.addresses[-1][1]

    async def _start_kv_events(self) -> None:
        opts = self.config.kv_events
        if opts is None:
            return
        cfg = self.engine.config
        host = opts.topic_host
        self.kv_publisher = KVEventPublisher(
            topic=f"kv@{f'[{host}]' if ':' in host else host}:{self._port}@{cfg.model}",
            block_size=cfg.block_size,
            lora_adapters=cfg.lora_adapters,
            bind=f"tcp://{self.config.host}:{opts.port}" if opts.port is not None else None,
            connect=opts.zmq_endpoint,
            replay_bind=f"tcp://{self.config.host}:{opts.replay_port}" if opts.replay_port is not None else None,
            batch_size=opts.batch_size,
            map_format=opts.map_format,
            dp_rank=opts.dp_rank,
        )
        await self.kv_publisher.start()
        self.engine.record_kv_events = True

    def _publish_kv_events(self, now: float) -> None:
        if self.kv_publisher is not None:
            self.kv_publisher.publish(self.engine.drain_kv_events(), time.time())

    async def stop(self) -> None:
        if self._restart_task is not None:
            self._restart_task.cancel()
        if self._site is not None:
            await self._site.stop()
            self._site = None
        self.driver.reset()  # wakes every waiting handler, so shutdown does not wait for them
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self._driver_task is not None:
            self._driver_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._driver_task
            self._driver_task = None
        if self.kv_publisher is not None:
            await self.kv_publisher.stop()
            self.kv_publisher = None

    async def __aenter__(self) -> SimServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def crash(self, down_s: float | None = None) -> None:
        """Die like a killed pod: close the port, drop every connection, lose the engine's state."""
        if self.crashed:
            return
        self.crashed = True
        self.crashes += 1
        log.warning("%s: crashing (down for %s s)", self.name, down_s)
        if self._site is not None:
            await self._site.stop()
            self._site = None
        if self._runner is not None and self._runner.server is not None:
            for conn in self._runner.server.connections:
                if conn.transport is not None:
                    conn.transport.abort()
        self.driver.reset()
        if self.kv_publisher is not None:
            self.kv_publisher.restart()
        if down_s is not None:
            self._restart_task = asyncio.create_task(self._restart_after(down_s))

    async def _restart_after(self, down_s: float) -> None:
        await asyncio.sleep(down_s)
        await self.restart()

    async def restart(self) -> None:
        if not self.crashed or self._runner is None:
            return
        await self._listen()
        self.crashed = False
        log.warning("%s: back up", self.name)

    # -- app --------------------------------------------------------------------------------------------------

    def _build_app(self) -> web.Application:
        app = web.Application(client_max_size=self.config.max_body_bytes, middlewares=[self._middleware])
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/tokenize", self._tokenize)
        app.router.add_post("/detokenize", self._detokenize)
        app.router.add_post("/reset_prefix_cache", self._reset_prefix_cache)
        app.router.add_get("/health", self._health)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/admin/faults", self._get_faults)
        app.router.add_post("/admin/faults", self._set_faults)
        app.router.add_post("/admin/crash", self._crash)
        app.router.add_get("/admin/stats", self._stats)
        return app

    @web.middleware
    async def _middleware(self, request: web.Request, handler: _Handler) -> web.StreamResponse:
        if self.crashed:  # a keep-alive connection that outlived the crash
            if request.transport is not None:
                request.transport.abort()
            raise web.HTTPServiceUnavailable()
        try:
            resp = await handler(request)
        except api.ApiError as exc:
            resp = self._error(exc.status, exc.type, exc.message, exc.param)
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            resp = self._error(exc.status, exc.reason.replace(" ", ""), exc.reason)
        except Exception:
            log.exception("%s: unexpected error on %s", self.name, request.path)
            resp = self._error(500, "InternalServerError", "internal simulator error")
        if not resp.prepared:
            resp.headers.update(self._headers)
        return resp

    def _error(self, status: int, type_: str, message: str, param: str | None = None) -> web.Response:
        return web.Response(
            status=status, body=api.error_body(status, type_, message, param), content_type="application/json"
        )

    def _json(self, obj: Any, status: int = 200) -> web.Response:
        return web.Response(status=status, body=orjson.dumps(obj), content_type="application/json")

    async def _read_json(self, request: web.Request) -> Any:
        limit = self.config.max_body_bytes
        if request.content_length is not None and request.content_length > limit:
            raise api.ApiError(413, "RequestTooLarge", f"request body larger than {limit} bytes")
        try:
            data = await request.read()
        except web.HTTPRequestEntityTooLarge:
            raise api.ApiError(413, "RequestTooLarge", f"request body larger than {limit} bytes") from None
        try:
            return orjson.loads(data)
        except orjson.JSONDecodeError as exc:
            raise api.ApiError.bad(f"malformed JSON: {exc}") from None

    # -- generation -------------------------------------------------------------------------------------------

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, "completions")

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, "chat")

    async def _generate(self, request: web.Request, kind: api.Kind) -> web.StreamResponse:
        cfg = self.engine.config
        parsed = api.parse_generate(kind, await self._read_json(request), self.tokenizer, cfg.model)
        if parsed.model != cfg.model and parsed.model not in cfg.lora_adapters:
            raise api.ApiError(404, "NotFoundError", f"The model `{parsed.model}` does not exist.", "model")
        fault = self.injector.on_request()
        if isinstance(fault, ErrorReply):
            raise api.ApiError(fault.status, fault.type, fault.message)
        if isinstance(fault, Hang):
            await asyncio.sleep(fault.seconds)
            if request.transport is not None:
                request.transport.abort()
            raise web.HTTPServiceUnavailable()
        if isinstance(fault, Crash):
            await self.crash(fault.down_s)
            raise web.HTTPServiceUnavailable()

        rid = ("chatcmpl-" if kind == "chat" else "cmpl-") + uuid.uuid4().hex
        sim_req = SimRequest(
            request_id=rid,
            prompt_ids=parsed.prompt_ids,
            max_tokens=parsed.max_tokens,
            min_tokens=parsed.min_tokens,
            ignore_eos=parsed.ignore_eos,
            lora=None if parsed.model == cfg.model else parsed.model,
            remote_prefill=parsed.remote_prefill,
        )
        try:
            handle = self.driver.submit(sim_req)
        except RequestRejected as exc:
            status, type_ = _REJECT_STATUS[exc.kind]
            raise api.ApiError(status, type_, exc.message) from None
        try:
            if parsed.stream:
                return await self._stream(request, parsed, handle, rid)
            return await self._whole(request, parsed, handle, rid)
        finally:
            if not handle.state.finished:  # client gone (handler cancelled) or write failed
                self.driver.abort(rid)

    def _aborted(self, request: web.Request) -> NoReturn:
        """The engine dropped the request (crash or shutdown): cut the connection like a dead server."""
        if request.transport is not None:
            request.transport.abort()
        raise web.HTTPServiceUnavailable()

    async def _whole(
        self, request: web.Request, parsed: api.ParsedRequest, handle: RequestHandle, rid: str
    ) -> web.StreamResponse:
        state = handle.state
        while not state.finished:
            await handle.wait()
        if state.finish_reason == "abort":
            return self._aborted(request)
        text = self.tokenizer.decode(state.output_ids)
        finish_reason: str = state.finish_reason or "stop"
        transfer = None
        if parsed.remote_decode:  # a prefill for a decode server: tell it where the KV is
            finish_reason = REMOTE_DECODE
            block_size = self.engine.config.block_size
            host, port = self.config.host, self.port
            transfer = api.remote_transfer_params(self.name, host, port, rid, state.prompt_tokens, block_size)
        body = api.completion_body(
            parsed.kind,
            rid,
            int(time.time()),
            parsed.model,
            text,
            finish_reason,
            api.usage(state.prompt_tokens, len(state.output_ids), state.cached_tokens),
            transfer,
        )
        return web.Response(body=body, content_type="application/json")

    async def _stream(
        self, request: web.Request, parsed: api.ParsedRequest, handle: RequestHandle, rid: str
    ) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        resp.headers.update(self._headers)
        await resp.prepare(request)
        state = handle.state
        kind, model, created = parsed.kind, parsed.model, int(time.time())
        token_text = self.tokenizer.token_text
        sent = 0
        while True:
            await handle.wait()
            if state.finish_reason == "abort":
                return self._aborted(request)
            out = state.output_ids
            n = len(out)
            parts: list[bytes] = []
            if sent == 0 and n and kind == "chat":
                parts.append(api.chunk(kind, rid, created, model, role=True))
            for i in range(sent, n):
                reason: str | None = state.finish_reason if state.finished and i == n - 1 else None
                if reason is not None and parsed.remote_decode:
                    reason = REMOTE_DECODE
                parts.append(api.chunk(kind, rid, created, model, text=token_text(out[i]), finish_reason=reason))
            sent = n
            if state.finished:
                if parsed.include_usage:
                    u = api.usage(state.prompt_tokens, n, state.cached_tokens)
                    parts.append(api.chunk(kind, rid, created, model, usage_=u))
                parts.append(b"data: [DONE]\n\n")
            if parts:
                await resp.write(b"".join(parts))
            if state.finished:
                await resp.write_eof()
                return resp

    # -- other endpoints --------------------------------------------------------------------------------------

    async def _models(self, request: web.Request) -> web.StreamResponse:
        cfg = self.engine.config
        created = int(time.time())
        data = [
            {
                "id": name,
                "object": "model",
                "created": created,
                "owned_by": "vllm",
                "root": name,
                "parent": None if name == cfg.model else cfg.model,
                "max_model_len": cfg.max_model_len,
            }
            for name in cfg.served_models
        ]
        return self._json({"object": "list", "data": data})

    async def _tokenize(self, request: web.Request) -> web.StreamResponse:
        body = await self._read_json(request)
        if not isinstance(body, dict):
            raise api.ApiError.bad("the request body must be a JSON object")
        if "messages" in body:
            text = api.render_chat(api._messages(body))
        elif isinstance(body.get("prompt"), str):
            text = body["prompt"]
        else:
            raise api.ApiError.bad("need a string 'prompt' or 'messages'", "prompt")
        ids = self.tokenizer.encode(text)
        out: dict[str, Any] = {"count": len(ids), "max_model_len": self.engine.config.max_model_len, "tokens": ids}
        if body.get("return_token_strs"):
            out["token_strs"] = [self.tokenizer.token_text(i) for i in ids]
        return self._json(out)

    async def _detokenize(self, request: web.Request) -> web.StreamResponse:
        body = await self._read_json(request)
        tokens = body.get("tokens") if isinstance(body, dict) else None
        if not isinstance(tokens, list) or not all(type(t) is int for t in tokens):
            raise api.ApiError.bad("'tokens' must be an array of integers", "tokens")
        try:
            text = self.tokenizer.decode(tokens)
        except ValueError as exc:
            raise api.ApiError.bad(str(exc), "tokens") from None
        return self._json({"prompt": text})

    async def _reset_prefix_cache(self, request: web.Request) -> web.StreamResponse:
        """vLLM's ``POST /reset_prefix_cache``: refused while requests hold blocks (vLLM fails it then too)."""
        if not self.engine.clear_cache():
            return self._error(409, "ConflictError", "requests are running; the prefix cache was not reset")
        self._publish_kv_events(0.0)
        return web.Response(status=200)

    async def _health(self, request: web.Request) -> web.StreamResponse:
        return web.Response(status=200)

    async def _metrics(self, request: web.Request) -> web.StreamResponse:
        faults = self.injector.faults
        if faults.metrics_delay_s:
            await asyncio.sleep(faults.metrics_delay_s)
        if faults.metrics_mode == "garbage":
            return web.Response(body=b"\x00\xffnot prometheus {{{ \n" * 64, content_type="text/plain")
        page = self.metrics.render()
        if faults.metrics_mode == "huge":
            resp = web.StreamResponse(headers={"Content-Type": CONTENT_TYPE_LATEST})
            resp.enable_chunked_encoding()
            await resp.prepare(request)
            await resp.write(page)
            filler = b"# " + b"x" * 65533 + b"\n"
            for _ in range(max(0, faults.metrics_huge_bytes - len(page)) // len(filler)):
                await resp.write(filler)
            await resp.write_eof()
            return resp
        resp = web.Response(body=page)
        resp.headers["Content-Type"] = CONTENT_TYPE_LATEST
        return resp

    async def _get_faults(self, request: web.Request) -> web.StreamResponse:
        return self._json(self.injector.faults.as_dict())

    async def _set_faults(self, request: web.Request) -> web.StreamResponse:
        body = await self._read_json(request)
        if not isinstance(body, dict):
            raise api.ApiError.bad("the request body must be a JSON object")
        try:
            self.injector.faults = self.injector.faults.updated(body)
        except (ValueError, TypeError) as exc:
            raise api.ApiError.bad(str(exc)) from None
        return self._json(self.injector.faults.as_dict())

    async def _crash(self, request: web.Request) -> web.StreamResponse:
        body = await self._read_json(request) if request.can_read_body else {}
        down_s = body.get("down_s") if isinstance(body, dict) else None
        if down_s is not None and (isinstance(down_s, bool) or not isinstance(down_s, int | float) or down_s < 0):
            raise api.ApiError.bad("'down_s' must be a number >= 0 or null", "down_s")
        # Answer first, then die (the reply would otherwise be cut off with the connection).
        asyncio.get_running_loop().call_later(0.05, self._crash_soon, down_s)
        return self._json({"crashing": True, "down_s": down_s}, status=202)

    def _crash_soon(self, down_s: float | None) -> None:
        self._crash_task = asyncio.create_task(self.crash(down_s))

    async def _stats(self, request: web.Request) -> web.StreamResponse:
        s = self.engine.stats()
        return self._json(
            {
                "name": self.name,
                "waiting": s.waiting,
                "running": s.running,
                "kv_usage": s.kv_usage,
                "prefix_queries_tokens": s.prefix_queries_tokens,
                "prefix_hits_tokens": s.prefix_hits_tokens,
                "preemptions": s.preemptions,
                "steps": s.steps,
                "busy_s": s.busy_s,
                "prefill_tokens": s.prefill_tokens,
                "pulled_tokens": s.pulled_tokens,
                "max_step_s": s.max_step_s,
                "driver_max_lag_s": self.driver.max_lag_s,
                "crashes": self.crashes,
            }
        )
