"""The HTTP server over real sockets on 127.0.0.1: every endpoint, streaming, usage, bad input."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from picker.sim.config import preset
from picker.sim.harness import running
from picker.sim.server import SimServer
from picker.sim.tokenizer import default_tokenizer

TOK = default_tokenizer()
PROMPT = " the quick brown dog can jump over every old wall in the big cold north wind" * 8  # 128 tokens


async def until(condition: Callable[[], bool], timeout_s: float = 5.0) -> None:
    for _ in range(int(timeout_s / 0.005)):
        if condition():
            return
        await asyncio.sleep(0.005)
    raise AssertionError("condition not reached")


@pytest.fixture
async def server() -> AsyncIterator[SimServer]:
    async with running(preset("fast", lora_adapters=("ad1", "ad2"), max_model_len=2048)) as srv:
        yield srv


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


async def post(http: aiohttp.ClientSession, url: str, body: Any) -> tuple[int, Any]:
    data = body if isinstance(body, bytes) else orjson.dumps(body)
    async with http.post(url, data=data, headers={"Content-Type": "application/json"}) as resp:
        raw = await resp.read()
        return resp.status, orjson.loads(raw) if raw else None


async def stream(http: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> list[Any]:
    events: list[Any] = []
    async with http.post(url, data=orjson.dumps({**body, "stream": True})) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("text/event-stream")
        async for line in resp.content:
            if line.startswith(b"data: "):
                data = line[6:].strip()
                events.append("[DONE]" if data == b"[DONE]" else orjson.loads(data))
    return events


async def test_models_lists_base_and_adapters(server: SimServer, http: aiohttp.ClientSession) -> None:
    async with http.get(f"{server.url}/v1/models") as resp:
        assert resp.headers["x-backend"] == server.name
        body = await resp.json()
    ids = {m["id"]: m["parent"] for m in body["data"]}
    assert ids == {"sim-model": None, "ad1": "sim-model", "ad2": "sim-model"}


async def test_completion_usage_and_text(server: SimServer, http: aiohttp.ClientSession) -> None:
    status, body = await post(http, f"{server.url}/v1/completions", {"prompt": PROMPT, "max_tokens": 7})
    assert status == 200
    assert body["object"] == "text_completion"
    choice = body["choices"][0]
    assert choice["finish_reason"] in ("stop", "length")
    usage = body["usage"]
    assert usage["prompt_tokens"] == len(TOK.encode(PROMPT)) == 128
    assert usage["completion_tokens"] == len(TOK.encode(choice["text"])) <= 7
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert usage["prompt_tokens_details"] == {"cached_tokens": 0}


async def test_repeated_prompt_reports_cached_tokens(server: SimServer, http: aiohttp.ClientSession) -> None:
    url = f"{server.url}/v1/completions"
    _, first = await post(http, url, {"prompt": PROMPT, "max_tokens": 2})
    _, second = await post(http, url, {"prompt": PROMPT, "max_tokens": 2})
    assert first["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert second["usage"]["prompt_tokens_details"]["cached_tokens"] == 112  # 128 tokens, last block recomputed
    assert second["choices"][0]["text"] == first["choices"][0]["text"]


async def test_completion_default_max_tokens_is_16(server: SimServer, http: aiohttp.ClientSession) -> None:
    _, body = await post(http, f"{server.url}/v1/completions", {"prompt": PROMPT, "ignore_eos": True})
    assert body["usage"]["completion_tokens"] == 16


async def test_token_id_prompt(server: SimServer, http: aiohttp.ClientSession) -> None:
    ids = TOK.encode(PROMPT)
    _, body = await post(http, f"{server.url}/v1/completions", {"prompt": ids, "max_tokens": 1})
    assert body["usage"]["prompt_tokens"] == len(ids)


async def test_chat_stream_one_token_per_chunk_and_usage(server: SimServer, http: aiohttp.ClientSession) -> None:
    body = {
        "model": "sim-model",
        "messages": [{"role": "system", "content": PROMPT}, {"role": "user", "content": " how are you"}],
        "max_tokens": 20,
        "min_tokens": 20,
        "stream_options": {"include_usage": True},
    }
    events = await stream(http, f"{server.url}/v1/chat/completions", body)
    assert events[-1] == "[DONE]"
    usage_chunk = events[-2]
    assert usage_chunk["choices"] == []
    chunks = events[:-2]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    texts = [c["choices"][0]["delta"]["content"] for c in chunks[1:]]
    assert len(texts) == 20
    assert all(len(TOK.encode(t)) == 1 for t in texts)
    assert len(TOK.encode("".join(texts))) == 20
    assert [c["choices"][0]["finish_reason"] for c in chunks[1:]] == [None] * 19 + ["length"]
    assert usage_chunk["usage"]["completion_tokens"] == 20
    assert usage_chunk["usage"]["prompt_tokens"] == len(TOK.encode(f"system:{PROMPT}\nuser: how are you\nassistant:"))
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)


async def test_completion_stream_without_usage(server: SimServer, http: aiohttp.ClientSession) -> None:
    events = await stream(http, f"{server.url}/v1/completions", {"prompt": PROMPT, "max_tokens": 5, "ignore_eos": True})
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert len(chunks) == 5
    assert all("usage" not in c for c in chunks)
    assert all(len(TOK.encode(c["choices"][0]["text"])) == 1 for c in chunks)


async def test_chat_non_stream(server: SimServer, http: aiohttp.ClientSession) -> None:
    status, body = await post(
        http,
        f"{server.url}/v1/chat/completions",
        {"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}], "max_completion_tokens": 3},
    )
    assert status == 200
    assert body["object"] == "chat.completion"
    assert body["choices"][0]["message"]["role"] == "assistant"
    assert body["usage"]["completion_tokens"] <= 3


async def test_lora_adapter_request(server: SimServer, http: aiohttp.ClientSession) -> None:
    status, body = await post(http, f"{server.url}/v1/completions", {"model": "ad1", "prompt": "hi", "max_tokens": 2})
    assert status == 200
    assert body["model"] == "ad1"


async def test_tokenize_detokenize_round_trip(server: SimServer, http: aiohttp.ClientSession) -> None:
    text = "The cat sat on the mat, naïvely."
    status, tok = await post(http, f"{server.url}/tokenize", {"prompt": text, "return_token_strs": True})
    assert status == 200
    assert tok["tokens"] == TOK.encode(text)
    assert tok["count"] == len(tok["tokens"])
    assert tok["max_model_len"] == 2048
    assert len(tok["token_strs"]) == tok["count"]
    _, detok = await post(http, f"{server.url}/detokenize", {"tokens": tok["tokens"]})
    assert detok["prompt"] == text
    _, chat = await post(http, f"{server.url}/tokenize", {"messages": [{"role": "user", "content": "hi"}]})
    assert chat["count"] == len(TOK.encode("user:hi\nassistant:"))


async def test_health(server: SimServer, http: aiohttp.ClientSession) -> None:
    async with http.get(f"{server.url}/health") as resp:
        assert resp.status == 200


async def test_metrics_parse_and_count(server: SimServer, http: aiohttp.ClientSession) -> None:
    for _ in range(2):
        await post(http, f"{server.url}/v1/completions", {"prompt": PROMPT, "max_tokens": 4, "ignore_eos": True})
    async with http.get(f"{server.url}/metrics") as resp:
        assert resp.status == 200
        text = await resp.text()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    for name in (
        "vllm:num_requests_waiting",
        "vllm:num_requests_running",
        "vllm:kv_cache_usage_perc",
        "vllm:lora_requests_info",
        "vllm:cache_config_info",
        "vllm:prefix_cache_hits",
        "vllm:prefix_cache_queries",
        "vllm:prompt_tokens",
        "vllm:generation_tokens",
        "vllm:request_success",
        "vllm:time_to_first_token_seconds",
        "vllm:inter_token_latency_seconds",
        "vllm:e2e_request_latency_seconds",
    ):
        assert name in families, name

    def value(family: str, sample: str, **labels: str) -> float:
        for s in families[family].samples:
            if s.name == sample and all(s.labels.get(k) == v for k, v in labels.items()):
                return float(s.value)
        raise KeyError(sample)

    assert value("vllm:prompt_tokens", "vllm:prompt_tokens_total") == 256
    assert value("vllm:generation_tokens", "vllm:generation_tokens_total") == 8
    assert value("vllm:prefix_cache_queries", "vllm:prefix_cache_queries_total") == 256
    assert value("vllm:prefix_cache_hits", "vllm:prefix_cache_hits_total") == 112
    assert value("vllm:request_success", "vllm:request_success_total", finish_reason="length") == 2
    assert value("vllm:time_to_first_token_seconds", "vllm:time_to_first_token_seconds_count") == 2
    assert value("vllm:inter_token_latency_seconds", "vllm:inter_token_latency_seconds_count") == 6
    assert value("vllm:e2e_request_latency_seconds", "vllm:e2e_request_latency_seconds_bucket", le="+Inf") == 2
    assert value("vllm:num_requests_running", "vllm:num_requests_running") == 0
    info = families["vllm:cache_config_info"].samples[0].labels
    assert (info["block_size"], info["num_gpu_blocks"]) == ("16", "512")
    lora = families["vllm:lora_requests_info"].samples[0].labels
    assert lora == {"running_lora_adapters": "", "waiting_lora_adapters": "", "max_lora": "1"}


async def test_gauges_show_a_running_request(server: SimServer, http: aiohttp.ClientSession) -> None:
    body = {"model": "ad2", "prompt": PROMPT, "max_tokens": 400, "ignore_eos": True, "stream": True}
    async with http.post(f"{server.url}/v1/completions", data=orjson.dumps(body)) as resp:
        await resp.content.readline()  # first token arrived: the request is running
        async with http.get(f"{server.url}/metrics") as m:
            text = await m.text()
    assert 'vllm:num_requests_running{engine="0",model_name="sim-model"} 1.0' in text
    assert 'running_lora_adapters="ad2"' in text
    # Leaving the stream early aborts the request in the engine.
    await until(lambda: not server.engine.has_work)


@pytest.mark.parametrize(
    ("body", "status"),
    [
        (b"{not json", 400),
        (b"[1, 2]", 400),
        ({"prompt": ""}, 400),
        ({"prompt": [1, 2], "max_tokens": "5"}, 400),
        ({"prompt": "hi", "max_tokens": 0}, 400),
        ({"prompt": "hi", "max_tokens": True}, 400),
        ({"prompt": "hi", "stream": "yes"}, 400),
        ({"prompt": "hi", "n": 2}, 400),
        ({"prompt": ["a", "b"]}, 400),
        ({"prompt": [10**9]}, 400),
        ({"prompt": "hi", "min_tokens": 9, "max_tokens": 3}, 400),
        ({"prompt": "hi", "stream_options": []}, 400),
        ({"prompt": "hi", "model": "nope"}, 404),
        ({"prompt": "hi", "max_tokens": 5000}, 400),
    ],
)
async def test_bad_completion_requests(server: SimServer, http: aiohttp.ClientSession, body: Any, status: int) -> None:
    got, err = await post(http, f"{server.url}/v1/completions", body)
    assert got == status
    assert err["error"]["code"] == status
    assert isinstance(err["error"]["message"], str)
    assert err["error"]["type"]


@pytest.mark.parametrize(
    "body",
    [{}, {"messages": []}, {"messages": [{"content": "x"}]}, {"messages": [{"role": "user", "content": 5}]}],
)
async def test_bad_chat_requests(server: SimServer, http: aiohttp.ClientSession, body: Any) -> None:
    got, err = await post(http, f"{server.url}/v1/chat/completions", body)
    assert got == 400
    assert err["error"]["type"] == "BadRequestError"


async def test_bad_tokenizer_requests(server: SimServer, http: aiohttp.ClientSession) -> None:
    assert (await post(http, f"{server.url}/tokenize", {"prompt": 5}))[0] == 400
    assert (await post(http, f"{server.url}/detokenize", {"tokens": ["a"]}))[0] == 400
    assert (await post(http, f"{server.url}/detokenize", {"tokens": [-1]}))[0] == 400


async def test_body_size_cap() -> None:
    async with running(preset("fast"), max_body_bytes=1000) as srv, aiohttp.ClientSession() as http:
        status, err = await post(http, f"{srv.url}/v1/completions", {"prompt": "x" * 2000})
        assert status == 413
        assert err["error"]["code"] == 413
        status, _ = await post(http, f"{srv.url}/v1/completions", {"prompt": "hi", "max_tokens": 1})
        assert status == 200  # still serving


async def test_queue_full_is_429() -> None:
    cfg = preset("fast", max_num_seqs=1, max_waiting=1)
    async with running(cfg) as srv, aiohttp.ClientSession() as http:
        url = f"{srv.url}/v1/completions"
        long = {"prompt": "hi", "max_tokens": 200, "ignore_eos": True}
        first = asyncio.create_task(post(http, url, long))
        await until(lambda: srv.engine.stats().running == 1)
        second = asyncio.create_task(post(http, url, long))
        await until(lambda: srv.engine.stats().waiting == 1)
        status, err = await post(http, url, long)
        assert status == 429
        assert err["error"]["type"] == "RateLimitError"
        assert [(await t)[0] for t in (first, second)] == [200, 200]
