"""The token source against the simulator's real /tokenize (completions and chat), its cache, deadline and
fail-open outcomes."""

from __future__ import annotations

import asyncio

import orjson
from aiohttp import web

from picker.endpoints.model import Endpoint
from picker.kvevents.tokens import ServerTokenSource
from picker.request.parse import parse_request
from picker.scheduling.plugins.token_producer import Params
from picker.sim import api as sim_api
from picker.sim.config import preset
from picker.sim.server import ServerConfig, SimServer
from picker.sim.tokenizer import default_tokenizer
from picker.telemetry import kvmetrics

HEADERS = {":path": "/v1/completions", ":method": "POST", "content-type": "application/json"}
CHAT = {**HEADERS, ":path": "/v1/chat/completions"}


def count(outcome: str) -> float:
    return kvmetrics.TOKENIZE.labels(outcome)._value.get()


def source(**params: object) -> ServerTokenSource:
    return ServerTokenSource(Params.model_validate(params))


async def test_ids_equal_what_the_engine_computes() -> None:
    tok = default_tokenizer()
    async with SimServer(preset("fast"), ServerConfig(port=0)) as sim:
        ep = Endpoint.create("127.0.0.1", sim.port)
        src = source()
        try:
            body = {"model": "sim-model", "prompt": "the cat sat on the mat " * 5}
            req = parse_request(HEADERS, orjson.dumps(body))
            server_before, cache_before = count("server"), count("cache")
            ids = await src.token_ids(req, [ep])
            assert list(ids or ()) == sim_api.parse_generate("completions", body, tok, "sim-model").prompt_ids
            assert await src.token_ids(req, [ep]) == ids
            assert (count("server"), count("cache")) == (server_before + 1, cache_before + 1)
            chat = {"model": "sim-model", "messages": [{"role": "user", "content": "hello there, how are you"}]}
            ids = await src.token_ids(parse_request(CHAT, orjson.dumps(chat)), [ep])
            assert list(ids or ()) == sim_api.parse_generate("chat", chat, tok, "sim-model").prompt_ids
            # a prompt that is already token ids needs no server
            given = await src.token_ids(parse_request(HEADERS, b'{"model":"m","prompt":[5,6,7]}'), [])
            assert given == (5, 6, 7)
        finally:
            await src.close()


async def test_slow_broken_or_absent_servers_fail_open() -> None:
    async def slow(_: web.Request) -> web.Response:
        await asyncio.sleep(1.0)
        return web.json_response({"tokens": [1]})

    async def broken(_: web.Request) -> web.Response:
        return web.json_response({"tokens": ["x"]})

    app = web.Application()
    app.router.add_post("/slow/tokenize", slow)
    app.router.add_post("/broken/tokenize", broken)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    req = parse_request(HEADERS, b'{"model":"m","prompt":"some text"}')
    try:
        timeouts, errors = count("timeout"), count("error")
        slow_src = source(vllm={"http": f"http://127.0.0.1:{port}/slow", "timeout": "50ms"})
        assert await slow_src.token_ids(req, []) is None
        assert count("timeout") == timeouts + 1
        bad_src = source(vllm={"http": f"http://127.0.0.1:{port}/broken"})
        assert await bad_src.token_ids(req, []) is None
        closed = Endpoint.create("127.0.0.1", 1)  # nothing listens there
        plain = source()
        assert await plain.token_ids(req, [closed]) is None
        assert count("error") == errors + 2
        for s in (slow_src, bad_src, plain):
            await s.close()
    finally:
        await runner.cleanup()
