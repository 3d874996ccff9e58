"""The routing sidecar and the servers' P/D roles, over real sockets on 127.0.0.1."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson
import pytest

from picker.sim.config import preset
from picker.sim.faults import Faults
from picker.sim.harness import running
from picker.sim.server import SimServer
from picker.sim.sidecar import PREFILLER_HEADER, RoutingSidecar, SidecarConfig, prefill_body

PROMPT = " the quick brown dog can jump over every old wall in the big cold north wind" * 8  # 128 tokens
ENGINE = preset("fast", kv_transfer_s_per_token=0.0001)


@dataclass
class Pool:
    prefill: SimServer
    decode: SimServer
    sidecar: RoutingSidecar
    http: aiohttp.ClientSession

    @property
    def prefiller(self) -> str:
        return f"127.0.0.1:{self.prefill.port}"


@pytest.fixture
async def pool() -> AsyncIterator[Pool]:
    async with running(ENGINE, name="prefill-0") as p, running(ENGINE, name="decode-0") as d:
        config = SidecarConfig(decoder_url=d.url, port=0, allowed_prefillers=frozenset({f"127.0.0.1:{p.port}"}))
        async with RoutingSidecar(config) as sidecar, aiohttp.ClientSession() as http:
            yield Pool(p, d, sidecar, http)


async def _post(pool: Pool, body: dict[str, Any], headers: dict[str, str] | None = None) -> tuple[int, Any, str]:
    url = pool.sidecar.url + "/v1/completions"
    async with pool.http.post(url, data=orjson.dumps(body), headers=headers or {}) as resp:
        raw = await resp.read()
        if body.get("stream"):
            return resp.status, raw, resp.headers.get("x-backend", "")
        return resp.status, orjson.loads(raw) if raw else None, resp.headers.get("x-backend", "")


BODY = {"model": "sim-model", "prompt": PROMPT, "max_tokens": 8, "min_tokens": 8, "ignore_eos": True}


def test_prefill_body_is_llm_d_nixl_v2() -> None:
    doc = {"model": "m", "messages": [], "stream": True, "stream_options": {"include_usage": True}, "max_tokens": 99}
    doc["min_tokens"] = 99
    out = prefill_body(doc, "/v1/chat/completions")
    assert out["kv_transfer_params"] == {
        "do_remote_decode": True,
        "do_remote_prefill": False,
        "remote_engine_id": None,
        "remote_block_ids": None,
        "remote_host": None,
        "remote_port": None,
    }
    assert out["stream"] is False
    assert "stream_options" not in out
    assert out["max_tokens"] == out["max_completion_tokens"] == 1
    assert "min_tokens" not in out
    assert doc["max_tokens"] == 99  # the original is untouched


async def test_a_named_prefiller_prefills_then_the_decode_server_pulls_and_decodes(pool: Pool) -> None:
    status, answer, backend = await _post(pool, BODY, {PREFILLER_HEADER: pool.prefiller})
    assert status == 200
    assert backend == "decode-0"
    assert answer["usage"]["completion_tokens"] == 8
    assert answer["choices"][0]["finish_reason"] == "length"
    assert pool.sidecar.prefills == 1
    prefill, decode = pool.prefill.engine.stats(), pool.decode.engine.stats()
    assert prefill.prefix_queries_tokens == answer["usage"]["prompt_tokens"]  # the prompt was computed there
    assert decode.prefix_queries_tokens == answer["usage"]["prompt_tokens"]  # ...and pulled here
    # The decode server computed one prompt token and eight decode tokens: no prefill step of 128 tokens.
    assert decode.steps == 8


async def test_streaming_through_the_sidecar(pool: Pool) -> None:
    body = {**BODY, "stream": True, "stream_options": {"include_usage": True}}
    status, raw, backend = await _post(pool, body, {PREFILLER_HEADER: f" {pool.prefiller} , 10.0.0.9:8000"})
    assert status == 200
    assert backend == "decode-0"
    events = [line[6:] for line in raw.split(b"\n") if line.startswith(b"data: ")]
    assert events[-1] == b"[DONE]"
    assert orjson.loads(events[-2])["usage"]["completion_tokens"] == 8
    assert pool.sidecar.prefills == 1  # the first of several prefillers


async def test_without_a_prefiller_the_request_passes_through(pool: Pool) -> None:
    status, answer, backend = await _post(pool, BODY)
    assert status == 200
    assert backend == "decode-0"
    assert pool.sidecar.passthrough == 1
    assert pool.prefill.engine.stats().steps == 0
    assert pool.decode.engine.stats().prefix_queries_tokens == answer["usage"]["prompt_tokens"]


async def test_a_prefiller_outside_the_allowlist_is_refused(pool: Pool) -> None:
    status, answer, _ = await _post(pool, BODY, {PREFILLER_HEADER: "10.9.9.9:8000"})
    assert status == 403
    assert "not allowed" in answer["error"]["message"]
    assert pool.prefill.engine.stats().steps == 0
    assert pool.decode.engine.stats().steps == 0


async def test_an_unreachable_prefiller_is_a_502() -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{s.getsockname()[1]}"
    async with running(ENGINE) as d:
        config = SidecarConfig(decoder_url=d.url, port=0, allowed_prefillers=None)
        async with RoutingSidecar(config) as sidecar, aiohttp.ClientSession() as http:
            url = sidecar.url + "/v1/completions"
            async with http.post(url, data=orjson.dumps(BODY), headers={PREFILLER_HEADER: dead}) as resp:
                assert resp.status == 502
            assert d.engine.stats().steps == 0


async def test_a_failing_prefill_is_relayed() -> None:
    async with running(ENGINE, faults=Faults(error_rate=1.0, error_types=("rate_limit",))) as p, running(ENGINE) as d:
        config = SidecarConfig(decoder_url=d.url, port=0, allowed_prefillers=frozenset({f"127.0.0.1:{p.port}"}))
        async with RoutingSidecar(config) as sidecar, aiohttp.ClientSession() as http:
            headers = {PREFILLER_HEADER: f"127.0.0.1:{p.port}"}
            async with http.post(sidecar.url + "/v1/completions", data=orjson.dumps(BODY), headers=headers) as resp:
                assert resp.status == 429
            assert d.engine.stats().steps == 0


async def test_other_paths_reach_the_decode_server(pool: Pool) -> None:
    async with pool.http.get(pool.sidecar.url + "/metrics") as resp:
        assert resp.status == 200
        assert "vllm:num_requests_waiting" in await resp.text()
    async with pool.http.get(pool.sidecar.url + "/v1/models") as resp:
        assert (await resp.json())["data"][0]["id"] == "sim-model"


async def test_the_prefill_server_answers_with_transfer_params(pool: Pool) -> None:
    body = {**BODY, "max_tokens": 1, "min_tokens": 0, "kv_transfer_params": {"do_remote_decode": True}}
    async with pool.http.post(pool.prefill.url + "/v1/completions", data=orjson.dumps(body)) as resp:
        answer = await resp.json()
    assert answer["choices"][0]["finish_reason"] == "remote_decode"
    params = answer["kv_transfer_params"]
    assert params["do_remote_prefill"] is True
    assert params["remote_engine_id"] == "prefill-0"
    assert (params["remote_host"], params["remote_port"]) == ("127.0.0.1", pool.prefill.port)
    assert len(params["remote_block_ids"]) == -(-answer["usage"]["prompt_tokens"] // ENGINE.block_size)


@pytest.mark.parametrize(
    "params",
    [[1], {"do_remote_decode": "yes"}, {"do_remote_decode": True, "do_remote_prefill": True}],
)
async def test_bad_transfer_params_are_a_400(pool: Pool, params: object) -> None:
    body = {**BODY, "kv_transfer_params": params}
    async with pool.http.post(pool.decode.url + "/v1/completions", data=orjson.dumps(body)) as resp:
        assert resp.status == 400
        assert (await resp.json())["error"]["param"] in {"kv_transfer_params", "do_remote_decode"}
