"""Prefill/decode disaggregation over real gRPC: what a decode pick carries, and the fallbacks.

picker runs llm-d's P/D sample (``prefix-based-pd-decider`` + ``disagg-profile-handler``) over a pool of two
prefill pods and two decode pods; each gateway drives it as it would, and the test reads what the upstream
request would carry.
"""

from __future__ import annotations

import dataclasses

import grpc
import orjson
import pytest
from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc

from picker.app import Running, serving
from picker.endpoints.model import Endpoint
from picker.endpoints.store import EndpointStore
from tests.conftest import endpoint
from tests.extproc.conftest import make_store, settings
from tests.extproc.gateway import (
    AgentGateway,
    EnvoyBuffered,
    EnvoyFullDuplex,
    Gateway,
    NginxShim,
    gateway,
    headers_msg,
)
from tests.scheduling.test_config import LLMD_PD

PREFILLER = "x-prefiller-host-port"
DESTINATION = "x-gateway-destination-endpoint"
ROLE = "llm-d.ai/role"
PATH = {":method": "POST", ":path": "/v1/completions", "content-type": "application/json"}
LONG = orjson.dumps({"model": "m", "prompt": "word " * 800, "max_tokens": 16})  # 1000 tokens: disaggregated
SHORT = orjson.dumps({"model": "m", "prompt": "hi", "max_tokens": 16})  # 2 tokens < nonCachedTokens 16


def _pods(*, prefill_excluded: bool = False) -> tuple[list[Endpoint], list[Endpoint]]:
    prefill = [
        endpoint(1, waiting=1, labels={ROLE: "prefill"}, excluded=prefill_excluded),
        endpoint(2, waiting=4, labels={ROLE: "prefill"}, excluded=prefill_excluded),
    ]
    decode = [endpoint(3, waiting=2, labels={ROLE: "decode"}), endpoint(4, labels={ROLE: "decode"})]
    return prefill, decode


def _serving(store: EndpointStore):  # type: ignore[no-untyped-def]
    return serving(dataclasses.replace(settings(), config_text=LLMD_PD), store=store, scrape=False)


@pytest.mark.parametrize("gw_cls", [EnvoyFullDuplex, EnvoyBuffered, AgentGateway])
async def test_a_disaggregated_pick_names_the_decode_pod_and_its_prefiller(gw_cls: type[Gateway]) -> None:
    prefill, decode = _pods()
    async with _serving(make_store([*prefill, *decode])) as r, gateway(gw_cls, r.grpc_target) as gw:
        out = await gw.request(PATH, [LONG])
        assert out.routed
        assert out.destination == decode[1].key  # the decode pod with the shorter queue
        assert out.metadata_destination == decode[1].key
        assert out.set_headers[PREFILLER] == prefill[0].key  # the prefill pod with the shorter queue
        assert out.upstream_body == LONG  # the body passes through unchanged


async def test_a_short_prompt_is_decode_only_and_a_client_sent_prefiller_is_removed() -> None:
    prefill, decode = _pods()
    async with _serving(make_store([*prefill, *decode])) as r, gateway(EnvoyFullDuplex, r.grpc_target) as gw:
        out = await gw.request({**PATH, PREFILLER: "10.66.6.6:8000"}, [SHORT])
        assert out.destination == decode[1].key
        assert PREFILLER not in out.set_headers
        assert PREFILLER in out.removed  # the sidecar must never prefill where a client says
        # On a disaggregated request picker's value overwrites the client's.
        out = await gw.request({**PATH, PREFILLER: "10.66.6.6:8000"}, [LONG])
        assert out.set_headers[PREFILLER] == prefill[0].key
        assert PREFILLER not in out.removed


async def test_no_healthy_prefill_pod_falls_back_to_decode_only() -> None:
    prefill, decode = _pods(prefill_excluded=True)  # stale metrics: not candidates
    async with _serving(make_store([*prefill, *decode])) as r, gateway(EnvoyFullDuplex, r.grpc_target) as gw:
        out = await gw.request(PATH, [LONG])
        assert out.routed
        assert out.destination in {decode[0].key, decode[1].key}
        assert PREFILLER not in out.set_headers


async def test_no_decode_pod_is_a_429() -> None:
    prefill, _ = _pods()
    async with _serving(make_store(prefill)) as r, gateway(EnvoyFullDuplex, r.grpc_target) as gw:
        out = await gw.request(PATH, [LONG])
        assert out.status == 429
        assert b"failed to find target endpoint" in out.error_body


async def test_nginx_shim_reads_only_the_destination() -> None:
    """The NGINX Gateway Fabric shim drops every other mutation: the decode pod is reached, decode-only."""
    prefill, decode = _pods()
    async with _serving(make_store([*prefill, *decode])) as r, gateway(NginxShim, r.grpc_target) as gw:
        out = await gw.request(PATH, [LONG])
        assert out.destination == decode[1].key


def _load(r: Running, ep: Endpoint) -> tuple[int, int]:
    load = r.inflight.load(ep.key)
    return load.requests, load.tokens


async def test_the_prefill_pod_is_leased_until_the_first_response_byte() -> None:
    """One Envoy stream, message by message: the prefill pod's lease covers the prefill, the decode pod's the rest."""
    prefill, decode = _pods()
    mode = processing_mode_pb2.ProcessingMode.FULL_DUPLEX_STREAMED
    config = pb.ProtocolConfiguration(request_body_mode=mode, response_body_mode=mode)
    async with _serving(make_store([*prefill, *decode])) as r, grpc.aio.insecure_channel(r.grpc_target) as channel:
        call = pb_grpc.ExternalProcessorStub(channel).Process(timeout=10.0)
        await call.write(headers_msg(PATH, config=config))
        await call.write(pb.ProcessingRequest(request_body=pb.HttpBody(body=LONG, end_of_stream=True)))
        routed = await call.read()
        assert routed.WhichOneof("response") == "request_headers"
        await call.read()  # the body, passed on
        prompt_tokens = 1000
        requests, tokens = _load(r, prefill[0])
        assert requests == 1
        assert tokens == pytest.approx(prompt_tokens + 1, rel=0.05)  # the prompt (estimated) and one token
        assert _load(r, decode[1])[0] == 1

        response_headers = headers_msg({":status": "200", "content-type": "text/event-stream"})
        await call.write(pb.ProcessingRequest(response_headers=response_headers.request_headers))
        await call.read()
        first = b'data: {"choices":[{"index":0,"text":" a"}]}\n\n'
        await call.write(pb.ProcessingRequest(response_body=pb.HttpBody(body=first)))
        await call.read()
        assert _load(r, prefill[0]) == (0, 0)  # prefilled: the decode pod is streaming
        assert _load(r, decode[1])[0] == 1

        await call.write(pb.ProcessingRequest(response_body=pb.HttpBody(body=b"data: [DONE]\n\n", end_of_stream=True)))
        await call.read()
        await call.done_writing()
        assert _load(r, decode[1]) == (0, 0)
