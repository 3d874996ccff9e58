"""picker serve with a precise-prefix-cache-scorer, end to end without a gateway: simulated vLLM servers publish
KV events on ZeroMQ, two picker replicas subscribe, one routes a prompt, the other — which never saw it — sends
the next request with that prefix to the server that now holds it."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import aiohttp
import orjson

from picker import app
from picker.app import Running
from picker.bench import procs
from picker.endpoints.store import EndpointStore
from picker.request.parse import parse_request
from picker.scheduling.plugins.precise_prefix import PrecisePrefixCacheScorer
from picker.settings import Settings, StaticEndpoint
from picker.sim.config import preset
from picker.sim.server import KVEventsOptions, ServerConfig, SimServer
from picker.telemetry import kvmetrics
from tests.extproc.conftest import settings as base_settings

HEADERS = {":path": "/v1/completions", ":method": "POST", "content-type": "application/json"}


def free_ports(n: int, *, consecutive: bool = False) -> list[int]:
    return procs.free_ports(n, consecutive=consecutive)  # outside the ephemeral range


def config(socket_port: int) -> str:
    return f"""\
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: precise-prefix-cache-scorer
  parameters:
    kvEventsConfig:
      podDiscoveryConfig:
        socketPort: {socket_port}
- type: token-producer
  parameters:
    vllm:
      timeout: 2s
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: precise-prefix-cache-scorer
"""


@contextlib.asynccontextmanager
async def sims(n: int) -> AsyncIterator[tuple[list[SimServer], int]]:
    http_ports = free_ports(n)
    kv_base = free_ports(n, consecutive=True)[0]
    servers = [
        SimServer(preset("fast"), ServerConfig(port=p, kv_events=KVEventsOptions(port=kv_base + i)))
        for i, p in enumerate(http_ports)
    ]
    for s in servers:
        await s.start()
    try:
        yield servers, kv_base
    finally:
        for s in servers:
            await s.stop()


def precise_of(running: Running) -> PrecisePrefixCacheScorer:
    (scorer,) = [p for p in running.scheduler.config.plugins.values() if isinstance(p, PrecisePrefixCacheScorer)]
    return scorer


async def send(running: Running, http: aiohttp.ClientSession, prompt: str) -> str:
    body = orjson.dumps({"model": "sim-model", "prompt": prompt, "max_tokens": 4})
    routed = await running.director.route(parse_request(HEADERS, body))
    key = routed.targets[0].key
    async with http.post(f"http://{key}/v1/completions", data=body, headers={"content-type": "application/json"}) as r:
        assert r.status == 200
        await r.read()
    running.director.complete(routed, status=200)
    return key


async def test_a_replica_routes_on_events_of_traffic_it_never_saw() -> None:
    async with sims(3) as (servers, kv_base):
        endpoints = tuple(StaticEndpoint("127.0.0.1", s.port) for s in servers)
        base = base_settings()
        settings = Settings(server=base.server, static_endpoints=endpoints, config_text=config(kv_base))
        metrics_port = free_ports(1)[0]
        with_metrics = Settings(
            server=base_settings(metrics_port=metrics_port).server,
            static_endpoints=endpoints,
            config_text=config(kv_base),
        )
        async with (
            app.serving(with_metrics, store=EndpointStore(), scrape=False) as a,
            app.serving(settings, store=EndpointStore(), scrape=False) as b,
            aiohttp.ClientSession() as http,
        ):
            assert a.kv_events is not None
            scorer_a, scorer_b = precise_of(a), precise_of(b)
            await asyncio.sleep(0.3)  # subscriptions reach the publishers
            shared = "You are a helpful assistant who answers questions about the sea and ships. " * 12
            first = await send(a, http, shared + "What is a keel?")
            # B never routed it, but the server's BlockStored events reach both replicas (each on its own
            # subscriber: on a loaded machine one may apply them a little later than the other).
            for _ in range(200):
                if 0 < scorer_b.index.endpoint_blocks(first) == scorer_a.index.endpoint_blocks(first):
                    break
                await asyncio.sleep(0.02)
            assert scorer_b.index.endpoint_blocks(first) > 0
            assert scorer_a.index.endpoint_blocks(first) == scorer_b.index.endpoint_blocks(first)
            precise_before = kvmetrics.SCORE_SOURCES.labels(scorer_b.name, "precise")._value.get()
            for question in ("What is a mast?", "Who steers?", "Why do ships float?"):
                assert await send(b, http, shared + question) == first
            assert kvmetrics.SCORE_SOURCES.labels(scorer_b.name, "precise")._value.get() == precise_before + 3
            # an unrelated prompt has no holder: nothing scores it above zero
            other = "Completely different words about mountains and rivers and the weather today. " * 10
            body = orjson.dumps({"model": "sim-model", "prompt": other, "max_tokens": 4})
            routed = await b.director.route(parse_request(HEADERS, body))
            assert routed.result is not None
            b.director.complete(routed, status=200)
            async with http.get(f"http://127.0.0.1:{metrics_port}/metrics") as resp:
                text = await resp.text()
            assert 'picker_kv_event_messages_total{outcome="applied"}' in text
            assert "picker_kv_index_entries" in text
            assert 'picker_tokenize_requests_total{outcome="server"}' in text
