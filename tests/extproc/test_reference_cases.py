"""The reference EPP's integration cases (protocol.md §14) that apply without Kubernetes, for every gateway.

Each case runs a real picker (grpc.aio on 127.0.0.1) over a static store whose metrics are set directly, driven
by each gateway's message pattern: Envoy FULL_DUPLEX_STREAMED, BUFFERED and STREAMED, NGINX Gateway Fabric's
shim and agentgateway. A case that cannot apply to a gateway (STREAMED decides before the body; the shim sends
no metadata, no header-only requests and no response phases) is not generated for it.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import AsyncIterator, Callable, Sequence

import orjson
import pytest

from picker.app import serving
from picker.endpoints.model import Endpoint
from tests.conftest import endpoint
from tests.extproc.conftest import make_store, picker, sample, settings
from tests.extproc.gateway import (
    GATEWAYS,
    AgentGateway,
    EnvoyBuffered,
    EnvoyFullDuplex,
    Gateway,
    NginxShim,
    Outcome,
    Response,
    gateway,
)

P1, P2, P3 = "192.168.1.1:8000", "192.168.1.2:8000", "192.168.1.3:8000"
HEADERS = {
    ":method": "POST",
    ":path": "/v1/completions",
    "content-type": "application/json",
    "hi": "mom",
    "x-request-id": "test-request-id",
}


def body(model: str = "my-model", prompt: str = "test prompt") -> bytes:
    return orjson.dumps({"max_tokens": 100, "model": model, "prompt": prompt, "temperature": 0})


def pods(
    queues: Sequence[int], kvs: Sequence[float], loras: Sequence[tuple[str, ...]] = ((), (), ())
) -> list[Endpoint]:
    return [
        endpoint(i + 1, waiting=q, kv=kv, loras=lo)
        for i, (q, kv, lo) in enumerate(zip(queues, kvs, loras, strict=True))
    ]


def gateways(where: Callable[[type[Gateway]], bool] = lambda g: True) -> pytest.MarkDecorator:
    chosen = [g for g in GATEWAYS if where(g)]
    return pytest.mark.parametrize("gw_cls", chosen, ids=[g.name for g in chosen])


@contextlib.asynccontextmanager
async def stack(gw_cls: type[Gateway], endpoints: Sequence[Endpoint], **server: object) -> AsyncIterator[Gateway]:
    store = make_store(endpoints)
    async with (
        picker(store, gateway_profile=gw_cls.server_profile, **server) as running,
        gateway(gw_cls, running.grpc_target) as gw,
    ):
        gw.running = running  # type: ignore[attr-defined]
        yield gw


def assert_routed(out: Outcome, gw: Gateway, destination: str) -> None:
    assert out.status is None, out.error_body
    assert out.destination == destination
    if isinstance(gw, NginxShim):
        return  # the shim reads nothing else
    assert out.metadata_destination == destination  # header and metadata never disagree
    assert out.clear_route_cache


def reads_body(g: type[Gateway]) -> bool:
    return g.reads_body


def has_metadata(g: type[Gateway]) -> bool:
    return g.sends_metadata


def has_response_phases(g: type[Gateway]) -> bool:
    return g.sends_response_phases


# 1. Routing by queue and KV cache.
@gateways()
async def test_routes_to_the_shortest_queue_and_lowest_kv(gw_cls: type[Gateway]) -> None:
    model = "my-model" if gw_cls.reads_body else ""
    labels = {"model_name": model, "target_model_name": model, "priority": "0"}
    before = sample("inference_objective_request_total", labels)
    async with stack(gw_cls, pods((3, 0, 10), (0.2, 0.1, 0.2))) as gw:
        out = await gw.request(HEADERS, [body()])
        assert_routed(out, gw, P2)
        assert out.upstream_body == body()  # byte-identical: nothing re-serialised
        assert sample("inference_objective_request_total", labels) == before + 1
        assert sample("inference_pool_ready_pods", {"name": "static"}) == 3
        if not isinstance(gw, NginxShim):
            assert "hi" not in out.set_headers  # original headers are not echoed back
            assert "x-request-id" not in out.set_headers  # the client's id stands
            assert not any(k.startswith(":") for k in out.set_headers)
        if gw.reads_body and not isinstance(gw, NginxShim):
            assert out.set_headers["content-length"] == str(len(body()))


# 2. The endpoint with the request's LoRA adapter active wins.
@gateways(reads_body)
async def test_adapter_affinity(gw_cls: type[Gateway]) -> None:
    adapter = "sql-lora-1fdg2"
    async with stack(gw_cls, pods((0, 0, 10), (0.2, 0.2, 0.2), ((), (adapter,), ()))) as gw:
        assert_routed(await gw.request(HEADERS, [body(adapter)]), gw, P2)


# 3. Affinity beats KV cache.
@gateways(reads_body)
async def test_affinity_beats_kv(gw_cls: type[Gateway]) -> None:
    adapter = "sql-lora-1fdg2"
    async with stack(gw_cls, pods((10, 10, 10), (0.2, 0.4, 0.3), ((), (adapter,), ()))) as gw:
        assert_routed(await gw.request(HEADERS, [body(adapter)]), gw, P2)


# 4. No shedding by default, however loaded the pool.
@gateways()
async def test_no_shedding_by_default(gw_cls: type[Gateway]) -> None:
    async with stack(gw_cls, pods((6, 0, 10), (0.2, 0.85, 0.9))) as gw:
        out = await gw.request({**HEADERS, "x-gateway-inference-objective": "sql-lora-sheddable"}, [body()])
        assert_routed(out, gw, P1)


# 5. Invalid JSON.
@gateways(reads_body)
async def test_invalid_json_is_400(gw_cls: type[Gateway]) -> None:
    errors_before = sample("picker_scheduling_errors_total", {"code": "BadRequest"})
    async with stack(gw_cls, pods((0, 0, 0), (0, 0, 0))) as gw:
        out = await gw.request(HEADERS, [b'{"max_tokens":100,"model":"my-model"'])
        assert out.status == 400
        assert out.error_body.startswith(b"inference error: BadRequest - error unmarshaling request bodyMap: ")
    assert sample("picker_scheduling_errors_total", {"code": "BadRequest"}) == errors_before + 1


# 6. A body split across chunks is reassembled (and passed on intact).
@gateways()
async def test_body_in_two_chunks(gw_cls: type[Gateway]) -> None:
    whole = body(prompt="a prompt long enough to split in two")
    async with stack(gw_cls, pods((3, 0, 10), (0.2, 0.1, 0.2))) as gw:
        out = await gw.request(HEADERS, [whole[:20], whole[20:]])
        assert_routed(out, gw, P2)
        assert out.upstream_body == whole


# 7. Header-only request (EOS on headers): no pods ⇒ 500; pods ⇒ some pod.
@gateways(lambda g: g is not NginxShim)
async def test_header_only_request_without_pods_is_500(gw_cls: type[Gateway]) -> None:
    async with stack(gw_cls, []) as gw:
        out = await gw.request({":method": "GET", ":path": "/v1/models"})
        assert out.status == 500
        assert out.error_body == b"inference error: Internal - no pods available in datastore"


@gateways(lambda g: g is not NginxShim)
async def test_header_only_request_goes_to_some_pod(gw_cls: type[Gateway]) -> None:
    async with stack(gw_cls, pods((3, 0, 10), (0.2, 0.1, 0.2))) as gw:
        out = await gw.request({":method": "GET", ":path": "/v1/models"})
        assert out.status is None
        assert out.destination in {P1, P2, P3}
        assert out.metadata_destination == out.destination
        assert out.answers[0].WhichOneof("response") == "request_headers"  # answered at once, no body to wait for
        assert "x-request-id" in out.set_headers  # none came in: picker generated one


# 8. No model in the body.
@gateways(reads_body)
async def test_missing_model_is_400(gw_cls: type[Gateway]) -> None:
    async with stack(gw_cls, pods((0, 0, 0), (0, 0, 0))) as gw:
        out = await gw.request(HEADERS, [b'{"prompt":"hello world"}'])
        assert out.status == 400
        assert out.error_body == b"inference error: BadRequest - model not found in request body"


# 9. Subset hints from the proxy's metadata.
@gateways(has_metadata)
@pytest.mark.parametrize(
    ("subset", "expected"),
    [
        ([P1, P2, P3], P2),
        ([P3], P3),  # despite its queue of 10
        (f"{P1},{P3}", P1),  # lwepp's comma-string form
        (["192.168.1.3"], P3),  # a bare IP admits every port of that pod
        ([P1, 7, None], P1),  # non-strings ignored
    ],
)
async def test_subset_hint(gw_cls: type[Gateway], subset: object, expected: str) -> None:
    async with stack(gw_cls, pods((3, 0, 10), (0.2, 0.1, 0.2))) as gw:
        assert_routed(await gw.request(HEADERS, [body()], subset=subset), gw, expected)


@gateways(has_metadata)
@pytest.mark.parametrize("subset", [["192.168.1.99:8000"], [], ["192.168.1.2:9999"]], ids=["no-match", "empty", "port"])
async def test_subset_hint_matching_nothing_is_503(gw_cls: type[Gateway], subset: object) -> None:
    async with stack(gw_cls, pods((3, 0, 10), (0.2, 0.1, 0.2))) as gw:
        out = await gw.request(HEADERS, [body()], subset=subset)
        assert out.status == 503
        assert out.error_body == (
            b"inference error: ServiceUnavailable - failed to find endpoint candidates for serving the request"
        )


@gateways(has_metadata)
async def test_subset_filter_can_be_disabled(gw_cls: type[Gateway]) -> None:
    async with stack(gw_cls, pods((3, 0, 10), (0.2, 0.1, 0.2)), disable_subset_filter=True) as gw:
        assert_routed(await gw.request(HEADERS, [body()], subset=[P3]), gw, P2)


# 10. The rewrite header forces the target model; the body sent upstream carries it, the client gets its own back.
@gateways(lambda g: g.reads_body and g is not NginxShim)
async def test_model_rewrite_header(gw_cls: type[Gateway]) -> None:
    labels = {"model_name": "my-model", "target_model_name": "rewritten-model", "priority": "0"}
    before = sample("inference_objective_request_total", labels)
    upstream_reply = orjson.dumps({"object": "text_completion", "model": "rewritten-model", "choices": []})
    async with stack(gw_cls, pods((3, 0, 10), (0.2, 0.1, 0.2))) as gw:
        out = await gw.request(
            {**HEADERS, "x-gateway-model-name-rewrite": "rewritten-model"},
            [body()],
            response=Response({"content-type": "application/json"}, [upstream_reply]),
        )
        assert_routed(out, gw, P2)
        assert out.upstream_body is not None
        sent = orjson.loads(out.upstream_body)
        assert sent == {**orjson.loads(body()), "model": "rewritten-model"}
        assert out.set_headers["content-length"] == str(len(out.upstream_body))
        assert "x-gateway-model-name-rewrite" in out.removed  # never reaches the model server
        assert out.client_body is not None
        assert orjson.loads(out.client_body)["model"] == "my-model"
    assert sample("inference_objective_request_total", labels) == before + 1


# 13. A JSON response in two chunks comes back whole (one EOS chunk in full duplex); usage is read.
@gateways(has_response_phases)
async def test_response_json_in_two_chunks(gw_cls: type[Gateway]) -> None:
    model = "my-model" if gw_cls.reads_body else ""
    labels = {"model_name": model, "target_model_name": model}
    before = sample("inference_objective_output_tokens_count", labels)
    reply = orjson.dumps(
        {"object": "text_completion", "model": "my-model", "usage": {"prompt_tokens": 7, "completion_tokens": 3}}
    )
    async with stack(gw_cls, pods((3, 0, 10), (0.2, 0.1, 0.2))) as gw:
        out = await gw.request(
            HEADERS, [body()], response=Response({"content-type": "application/json"}, [reply[:15], reply[15:]])
        )
        assert_routed(out, gw, P2)
        assert out.client_body == reply
        if gw.response_mode == EnvoyFullDuplex.response_mode:
            chunks = [a for a in out.answers if a.WhichOneof("response") == "response_body"]
            assert len(chunks) == 1
            assert chunks[0].response_body.response.body_mutation.streamed_response.end_of_stream
        running = gw.running  # type: ignore[attr-defined]
        assert running.inflight.requests(P2) == 0  # completed: the lease is released
    assert sample("inference_objective_output_tokens_count", labels) == before + 1


@gateways(has_response_phases)
async def test_invalid_json_response_passes_unchanged(gw_cls: type[Gateway]) -> None:
    async with stack(gw_cls, pods((3, 0, 10), (0.2, 0.1, 0.2))) as gw:
        out = await gw.request(
            HEADERS, [body()], response=Response({"content-type": "application/json"}, [b"{not json", b""])
        )
        assert out.client_body == b"{not json"


# 14. SSE with a usage line split across two chunks: echoed 1:1, usage counted once.
@gateways(has_response_phases)
async def test_sse_usage_split_across_chunks(gw_cls: type[Gateway]) -> None:
    model = "my-model" if gw_cls.reads_body else ""
    labels = {"model_name": model, "target_model_name": model}
    count, total = (sample(f"inference_objective_input_tokens_{s}", labels) for s in ("count", "sum"))
    chunks = [
        b"data: {}\n\n",
        b'data: {"usage":{"prompt_tok',
        b'ens":7,"total_tokens":17,"completion_tokens":10}}\n\ndata: [DONE]\n\n',
        b"",
    ]
    async with stack(gw_cls, pods((3, 0, 10), (0.2, 0.1, 0.2))) as gw:
        out = await gw.request(HEADERS, [body()], response=Response({"content-type": "text/event-stream"}, chunks))
        assert out.client_body == b"".join(chunks)
        if gw.response_mode == EnvoyFullDuplex.response_mode:  # streamed: one answer per chunk, at once
            assert len([a for a in out.answers if a.WhichOneof("response") == "response_body"]) == len(chunks)
    assert sample("inference_objective_input_tokens_count", labels) == count + 1
    assert sample("inference_objective_input_tokens_sum", labels) == total + 7


# Request and response trailers are answered (the reference never answers request trailers).
@gateways(lambda g: g is not NginxShim)
async def test_trailers_are_answered(gw_cls: type[Gateway]) -> None:
    async with stack(gw_cls, pods((3, 0, 10), (0.2, 0.1, 0.2))) as gw:
        out = await gw.request(
            HEADERS,
            [body()],
            trailers=True,
            response=Response({"content-type": "application/json"}, [b'{"ok":true}'], trailers=True),
        )
        assert_routed(out, gw, P2)
        kinds = [a.WhichOneof("response") for a in out.answers]
        assert "request_trailers" in kinds
        assert kinds[-1] == "response_trailers"
        assert out.upstream_body == body()
        assert out.client_body == b'{"ok":true}'
        assert gw.running.inflight.requests(P2) == 0  # type: ignore[attr-defined]


# A destination header sent by the client is overwritten, never honoured.
@gateways()
async def test_client_destination_header_is_ignored(gw_cls: type[Gateway]) -> None:
    async with stack(gw_cls, pods((3, 0, 10), (0.2, 0.1, 0.2))) as gw:
        out = await gw.request({**HEADERS, "x-gateway-destination-endpoint": P3}, [body()])
        assert_routed(out, gw, P2)
        for answer in out.answers:
            kind = answer.WhichOneof("response")
            if kind in ("request_headers", "request_body"):
                for option in getattr(answer, kind).response.header_mutation.set_headers:
                    assert option.append_action == option.OVERWRITE_IF_EXISTS_OR_ADD


@gateways(lambda g: g is not NginxShim)
async def test_control_headers_are_removed(gw_cls: type[Gateway]) -> None:
    control = {
        "x-gateway-inference-objective": "gold",
        "x-gateway-inference-fairness-id": "tenant-a",
        "x-gateway-destination-endpoint-served": P1,
    }
    async with stack(gw_cls, pods((3, 0, 10), (0.2, 0.1, 0.2))) as gw:
        out = await gw.request({**HEADERS, **control}, [body()])
        assert_routed(out, gw, P2)
        assert set(control) <= set(out.removed)


# Fallback endpoints: Envoy gets the comma list; agentgateway and the shim only the first.
@gateways()
async def test_fallbacks_follow_the_gateway(gw_cls: type[Gateway]) -> None:
    config = """\
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: queue-scorer
- type: max-score-picker
  parameters: {maxNumOfEndpoints: 2}
schedulingProfiles:
- name: default
  plugins: [{pluginRef: queue-scorer}, {pluginRef: max-score-picker}]
"""
    store = make_store(pods((3, 0, 10), (0.2, 0.1, 0.2)))
    s = dataclasses.replace(settings(gateway_profile=gw_cls.server_profile), config_text=config)
    async with serving(s, store=store, scrape=False) as running, gateway(gw_cls, running.grpc_target) as gw:
        out = await gw.request(HEADERS, [body()])
        expected = P2 if gw_cls in (AgentGateway, NginxShim) else f"{P2},{P1}"
        assert out.destination == expected
        if gw_cls is not NginxShim:
            assert out.metadata_destination == expected


# The shim reports no response: the in-flight count is held until its timeout, then released.
async def test_shim_requests_are_held_until_the_inflight_timeout() -> None:
    async with stack(NginxShim, pods((3, 0, 10), (0.2, 0.1, 0.2))) as gw:
        running = gw.running  # type: ignore[attr-defined]
        assert_routed(await gw.request(HEADERS, [body()]), gw, P2)
        assert running.inflight.requests(P2) == 1
        assert running.director.held == 1
        timeout = running.settings.server.inflight_timeout_s
        assert running.director.expire(running.director.clock() + timeout + 1) == 1
        assert running.inflight.requests(P2) == 0


async def test_envoy_stream_ending_before_the_response_releases_at_once() -> None:
    async with stack(EnvoyBuffered, pods((3, 0, 10), (0.2, 0.1, 0.2))) as gw:
        running = gw.running  # type: ignore[attr-defined]
        assert_routed(await gw.request(HEADERS, [body()]), gw, P2)  # stream closed without response phases
        assert running.inflight.requests(P2) == 0
        assert running.director.held == 0
