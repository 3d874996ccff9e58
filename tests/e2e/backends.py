"""Small OpenAI-style HTTP backends for the end-to-end tests; each reports its own queue depth.

Each backend serves ``/v1/completions`` and ``/v1/chat/completions`` (JSON or SSE), ``/metrics`` with vLLM's
gauge names (the queue depth the test sets), and records what it served, so a test can check that a request landed
on the backend picker chose and that control headers never reached it.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web

STREAM_WORDS = ["alpha ", "beta ", "gamma ", "delta ", "epsilon ", "zeta ", "eta ", "theta "]


@dataclass
class Served:
    path: str
    headers: dict[str, str]
    body: dict[str, Any]


@dataclass
class Backend:
    name: str
    queue: int = 0
    kv_usage: float = 0.1
    served: list[Served] = field(default_factory=list)
    port: int = 0  # 0: any free port (read it after start)
    host: str = "127.0.0.1"  # any 127.0.0.0/8 address: several "pods" can share one port, as a pool's pods do
    delay_s: float = 0.0  # time to "generate" before answering: keeps requests in flight
    word_delay_s: float = 0.002  # between streamed (SSE) chunks
    _runner: web.AppRunner | None = None

    @property
    def hostport(self) -> str:
        return f"{self.host}:{self.port}"

    async def start(self) -> None:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_post("/v1/completions", self._generate)
        app.router.add_post("/v1/chat/completions", self._generate)
        app.router.add_get("/v1/models", self._models)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        await site.start()
        server = site._server
        assert server is not None
        self.port = server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _metrics(self, _: web.Request) -> web.Response:
        text = (
            "# TYPE vllm:num_requests_waiting gauge\n"
            f'vllm:num_requests_waiting{{model_name="m"}} {self.queue}\n'
            "# TYPE vllm:num_requests_running gauge\n"
            f'vllm:num_requests_running{{model_name="m"}} 1\n'
            "# TYPE vllm:kv_cache_usage_perc gauge\n"
            f'vllm:kv_cache_usage_perc{{model_name="m"}} {self.kv_usage}\n'
        )
        return web.Response(text=text, content_type="text/plain")

    async def _models(self, _: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "m", "object": "model"}]})

    async def _generate(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        body = orjson.loads(raw)
        self.served.append(Served(request.path, {k.lower(): v for k, v in request.headers.items()}, body))
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        n = int(body.get("max_tokens") or 4)
        words = [STREAM_WORDS[i % len(STREAM_WORDS)] for i in range(n)]
        usage = {"prompt_tokens": 7, "completion_tokens": n, "total_tokens": 7 + n}
        chat = request.path.endswith("/chat/completions")
        if not body.get("stream"):
            choice: dict[str, Any] = (
                {"index": 0, "message": {"role": "assistant", "content": "".join(words)}, "finish_reason": "length"}
                if chat
                else {"index": 0, "text": "".join(words), "finish_reason": "length"}
            )
            return web.json_response(
                {
                    "id": "x",
                    "object": "chat.completion" if chat else "text_completion",
                    "model": body.get("model"),
                    "choices": [choice],
                    "usage": usage,
                },
                headers={"x-backend": self.name},
            )
        resp = web.StreamResponse(headers={"content-type": "text/event-stream", "x-backend": self.name})
        await resp.prepare(request)
        for word in words:
            delta: dict[str, Any] = {"index": 0, "delta": {"content": word}} if chat else {"index": 0, "text": word}
            chunk = {
                "id": "x",
                "object": "chat.completion.chunk" if chat else "text_completion",
                "model": body.get("model"),
                "choices": [delta],
            }
            await resp.write(b"data: " + orjson.dumps(chunk) + b"\n\n")
            await asyncio.sleep(self.word_delay_s)
        final = {
            "id": "x",
            "object": "chat.completion.chunk" if chat else "text_completion",
            "model": body.get("model"),
            "choices": [],
            "usage": usage,
        }
        await resp.write(b"data: " + orjson.dumps(final) + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp
