"""The token source against the simulator's real /tokenize (completions and chat), its cache, deadline and
fail-open outcomes."""

from __future__ import annotations

import asyncio
from pathlib import Path

import orjson
import pytest
from aiohttp import web

from picker import errors
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


def tiny_tokenizer(path: Path) -> Path:
    """A real HuggingFace tokenizer.json, trained here on a few sentences (no hub access)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>", "<s>"])
    tok.train_from_iterator(["the cat sat on the mat", "a dog ran in the park", "ships float on the sea"] * 20, trainer)
    out = path / "tokenizer.json"
    tok.save(str(out))
    return out


async def test_local_tokenizer_for_completions(tmp_path: Path) -> None:
    from tokenizers import Tokenizer

    path = tiny_tokenizer(tmp_path)
    src = source(localTokenizer={"path": str(path)})
    locals_before = count("local")
    req = parse_request(HEADERS, orjson.dumps({"model": "m", "prompt": "the cat sat on the sea"}))
    ids = await src.token_ids(req, [])  # no server needed
    assert ids == tuple(Tokenizer.from_file(str(path)).encode("the cat sat on the sea").ids)
    assert count("local") == locals_before + 1
    # chat needs the server's chat template: with no candidates and no vllm.http it is skipped (fail open)
    chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    assert await src.token_ids(parse_request(CHAT, orjson.dumps(chat)), []) is None
    await src.close()


def test_bad_local_tokenizer_is_a_config_error(tmp_path: Path) -> None:
    bad = tmp_path / "nope.json"
    bad.write_text("{}")
    with pytest.raises(errors.ConfigError, match="localTokenizer"):
        source(localTokenizer={"path": str(bad)})
