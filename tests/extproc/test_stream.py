"""The stream state machine without gRPC: message lists in, responses out."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import orjson
import pytest
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb

from picker.control.director import DEFAULT_TPOT_S, HOLD_OVERHEAD_S, Director
from picker.endpoints.inflight import InflightTracker
from picker.endpoints.store import EndpointStore
from picker.extproc.responses import BODY_CHUNK_BYTES
from picker.extproc.stream import EXPLAIN_HEADER, Phase, Stream, StreamEnv
from picker.request.model import InferenceRequest
from picker.scheduling.config import load_config
from picker.scheduling.framework import PluginContext, PluginTiming, ResponseInfo
from picker.scheduling.scheduler import Scheduler
from picker.settings import ServerSettings
from tests.conftest import FakeClock, endpoint
from tests.extproc.conftest import REFERENCE_CONFIG
from tests.extproc.gateway import MODE, headers_msg, served_metadata, subset_metadata

P1, P2, P3 = "192.168.1.1:8000", "192.168.1.2:8000", "192.168.1.3:8000"
HEADERS = {":method": "POST", ":path": "/v1/completions", "x-request-id": "rid"}
BODY = b'{"model":"my-model","prompt":"hello","max_tokens":10}'


class RecordingScheduler(Scheduler):
    def __init__(self, *args: object) -> None:
        super().__init__(*args)  # type: ignore[arg-type]
        self.infos: list[ResponseInfo] = []

    def post_response(self, req: InferenceRequest, info: ResponseInfo) -> tuple[PluginTiming, ...]:
        self.infos.append(info)
        return super().post_response(req, info)


@dataclasses.dataclass
class Env:
    env: StreamEnv
    director: Director
    scheduler: RecordingScheduler
    inflight: InflightTracker
    clock: FakeClock

    def stream(self) -> Stream:
        return Stream(self.env)


def make_env(**server: object) -> Env:
    clock = FakeClock()
    store = EndpointStore()
    store.set_endpoints([endpoint(1, waiting=3, kv=0.2), endpoint(2, kv=0.1), endpoint(3, waiting=10, kv=0.2)])
    inflight = InflightTracker()
    ctx = PluginContext(clock=clock, inflight=inflight)
    scheduler = RecordingScheduler(load_config(REFERENCE_CONFIG, ctx), ctx)
    settings = dataclasses.replace(ServerSettings(), **server)  # type: ignore[arg-type]
    director = Director(store=store, scheduler=scheduler, inflight=inflight, clock=clock, settings=settings)
    return Env(StreamEnv(director=director, settings=settings), director, scheduler, inflight, clock)


def config(request_mode: int = MODE.FULL_DUPLEX_STREAMED, response_mode: int | None = None) -> pb.ProtocolConfiguration:
    return pb.ProtocolConfiguration(
        request_body_mode=request_mode,  # type: ignore[arg-type]
        response_body_mode=request_mode if response_mode is None else response_mode,  # type: ignore[arg-type]
    )


def body_msg(data: bytes, eos: bool = True) -> pb.ProcessingRequest:
    return pb.ProcessingRequest(request_body=pb.HttpBody(body=data, end_of_stream=eos))


def response_headers(content_type: str = "application/json", eos: bool = False) -> pb.ProcessingRequest:
    msg = headers_msg({":status": "200", "content-type": content_type}, eos=eos)
    return pb.ProcessingRequest(response_headers=msg.request_headers)


def response_body(data: bytes, eos: bool = False) -> pb.ProcessingRequest:
    return pb.ProcessingRequest(response_body=pb.HttpBody(body=data, end_of_stream=eos))


async def feed(stream: Stream, msgs: Sequence[pb.ProcessingRequest]) -> list[pb.ProcessingResponse]:
    out: list[pb.ProcessingResponse] = []
    for msg in msgs:
        out.extend(await stream.on_message(msg))
    return out


def kinds(answers: Sequence[pb.ProcessingResponse]) -> list[str | None]:
    return [a.WhichOneof("response") for a in answers]


def set_headers(answer: pb.ProcessingResponse) -> dict[str, str]:
    common = getattr(answer, answer.WhichOneof("response") or "").response
    return {o.header.key: o.header.raw_value.decode() for o in common.header_mutation.set_headers}


def immediate(answers: Sequence[pb.ProcessingResponse]) -> tuple[int, bytes]:
    assert kinds(answers)[-1] == "immediate_response"
    imm = answers[-1].immediate_response
    return int(imm.status.code), imm.body


@pytest.mark.parametrize(
    ("msgs", "message"),
    [
        ([body_msg(BODY)], b"request body before request headers"),
        ([pb.ProcessingRequest(request_trailers=pb.HttpTrailers())], b"request trailers before request headers"),
        ([headers_msg(HEADERS, config=config()), headers_msg(HEADERS)], b"request headers received twice"),
        ([headers_msg(HEADERS, config=config()), response_headers()], b"response headers out of order"),
    ],
)
async def test_messages_out_of_order_before_routing_are_400(msgs: list[pb.ProcessingRequest], message: bytes) -> None:
    stream = make_env().stream()
    status, text = immediate(await feed(stream, msgs))
    assert status == 400
    assert message in text
    assert stream.done


async def test_messages_after_completion_close_the_stream_cleanly() -> None:
    e = make_env()
    stream = e.stream()
    await feed(stream, [headers_msg(HEADERS, config=config()), body_msg(BODY), response_headers(eos=True)])
    assert stream.phase is Phase.COMPLETE
    assert await stream.on_message(body_msg(BODY)) == ()
    assert stream.done
    assert await stream.on_message(response_headers()) == ()


async def test_body_over_the_limit_is_413() -> None:
    stream = make_env(max_body_bytes=100).stream()
    out = await feed(
        stream, [headers_msg(HEADERS, config=config()), body_msg(b"x" * 60, False), body_msg(b"x" * 60, False)]
    )
    status, text = immediate(out)
    assert status == 413
    assert text.startswith(b"inference error: PayloadTooLarge - ")


async def test_full_duplex_body_comes_back_in_chunks_of_at_most_62000_bytes() -> None:
    prompt = "word " * 30_000
    big = orjson.dumps({"model": "my-model", "prompt": prompt})
    out = await feed(make_env().stream(), [headers_msg(HEADERS, config=config()), body_msg(big)])
    assert kinds(out)[0] == "request_headers"
    chunks = [a.request_body.response.body_mutation.streamed_response for a in out[1:]]
    assert all(len(c.body) <= BODY_CHUNK_BYTES for c in chunks)
    assert [c.end_of_stream for c in chunks] == [False] * (len(chunks) - 1) + [True]
    assert b"".join(c.body for c in chunks) == big


async def test_full_duplex_empty_body_is_one_empty_eos_chunk() -> None:
    out = await feed(make_env().stream(), [headers_msg(HEADERS, config=config()), body_msg(b"", True)])
    assert kinds(out) == ["request_headers", "request_body"]
    assert set_headers(out[0])["x-gateway-destination-endpoint"] in {P1, P2, P3}
    assert "content-length" not in set_headers(out[0])
    sr = out[1].request_body.response.body_mutation.streamed_response
    assert sr.body == b""
    assert sr.end_of_stream


async def test_buffered_routes_on_the_body_answer_and_replaces_a_rewritten_body() -> None:
    stream = make_env().stream()
    first = await stream.on_message(
        headers_msg({**HEADERS, "x-gateway-model-name-rewrite": "other"}, config=config(MODE.BUFFERED))
    )
    assert kinds(first) == ["request_headers"]
    assert not first[0].request_headers.response.HasField("header_mutation")  # answered at once, empty
    out = await stream.on_message(body_msg(BODY))
    common = out[0].request_body.response
    new_body = common.body_mutation.body
    assert orjson.loads(new_body)["model"] == "other"
    assert set_headers(out[0])["content-length"] == str(len(new_body))
    assert common.clear_route_cache


async def test_buffered_unchanged_body_is_not_replaced() -> None:
    stream = make_env().stream()
    await stream.on_message(headers_msg(HEADERS, config=config(MODE.BUFFERED)))
    out = await stream.on_message(body_msg(BODY))
    assert not out[0].request_body.response.HasField("body_mutation")
    assert set_headers(out[0])["x-gateway-destination-endpoint"] == P2


async def test_buffered_partial_prefix_is_routed_without_parsing() -> None:
    stream = make_env().stream()
    await stream.on_message(headers_msg(HEADERS, config=config(MODE.BUFFERED_PARTIAL)))
    out = await stream.on_message(body_msg(BODY[:10], eos=False))  # truncated JSON: not a 400
    assert kinds(out) == ["request_body"]
    assert set_headers(out[0])["x-gateway-destination-endpoint"] in {P1, P2, P3}


async def test_streamed_decides_on_headers_and_passes_chunks() -> None:
    stream = make_env().stream()
    first = await stream.on_message(headers_msg(HEADERS, config=config(MODE.STREAMED)))
    assert set_headers(first[0])["x-gateway-destination-endpoint"] == P2
    for eos in (False, True):
        out = await stream.on_message(body_msg(b"{}", eos))
        assert kinds(out) == ["request_body"]
        assert not out[0].request_body.response.HasField("body_mutation")


async def test_subset_metadata_is_merged_across_messages() -> None:
    stream = make_env().stream()
    first = headers_msg(HEADERS, config=config())
    first.metadata_context.CopyFrom(subset_metadata([P3]))
    await stream.on_message(first)
    out = await stream.on_message(body_msg(BODY))  # no metadata on this one: the earlier hint stands
    assert set_headers(out[0])["x-gateway-destination-endpoint"] == P3


async def test_a_later_subset_hint_overrides_an_earlier_one() -> None:
    stream = make_env().stream()
    first = headers_msg(HEADERS, config=config())
    first.metadata_context.CopyFrom(subset_metadata([P3]))
    await stream.on_message(first)
    last = body_msg(BODY)
    last.metadata_context.CopyFrom(subset_metadata([P1]))
    out = await stream.on_message(last)
    assert set_headers(out[0])["x-gateway-destination-endpoint"] == P1


async def test_explain_header_carries_the_scores() -> None:
    out = await feed(make_env(explain_header=True).stream(), [headers_msg(HEADERS, config=config()), body_msg(BODY)])
    explanation = orjson.loads(set_headers(out[0])[EXPLAIN_HEADER])
    assert explanation["targets"] == [P2]
    assert "queue-scorer" in explanation["profiles"][0]["scores"]


async def test_response_path_observes_ttft_usage_and_served_endpoint() -> None:
    e = make_env()
    stream = e.stream()
    await feed(stream, [headers_msg(HEADERS, config=config()), body_msg(BODY)])
    assert e.inflight.requests(P2) == 1
    rh = response_headers("text/event-stream")
    rh.metadata_context.CopyFrom(served_metadata(P2))
    await stream.on_message(rh)
    e.clock.advance(0.25)
    await stream.on_message(response_body(b'data: {"choices":[{"text":"a"}]}\n\n'))
    e.clock.advance(0.5)
    usage = b'data: {"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":3}}\n\ndata: [DONE]\n\n'
    await stream.on_message(response_body(usage, eos=True))
    assert e.inflight.requests(P2) == 0
    assert e.inflight.load(P2).ttft_s == pytest.approx(0.25)
    info = e.scheduler.infos[-1]
    assert (info.endpoint_key, info.status, info.prompt_tokens, info.completion_tokens) == (P2, 200, 5, 3)
    assert info.ttft_s == pytest.approx(0.25)


async def test_streamed_sse_gets_the_client_model_back_across_chunk_splits() -> None:
    stream = make_env().stream()
    await feed(
        stream, [headers_msg({**HEADERS, "x-gateway-model-name-rewrite": "big-model"}, config=config()), body_msg(BODY)]
    )
    await stream.on_message(response_headers("text/event-stream"))
    event = b'data: {"model":"big-model","choices":[{"text":"hi"}]}\n\n'
    out = []
    for part, eos in ((event[:20], False), (event[20:], False), (b"data: [DONE]\n\n", True)):
        out.extend(await stream.on_message(response_body(part, eos)))
    sent = b"".join(a.response_body.response.body_mutation.streamed_response.body for a in out)
    assert sent == event.replace(b"big-model", b"my-model") + b"data: [DONE]\n\n"
    assert out[-1].response_body.response.body_mutation.streamed_response.end_of_stream


async def test_full_duplex_response_over_the_buffer_cap_passes_through() -> None:
    stream = make_env(max_response_buffer_bytes=10).stream()
    await feed(stream, [headers_msg(HEADERS, config=config()), body_msg(BODY), response_headers()])
    out = []
    parts = [b'{"a":"0123', b"456789012345", b'"}']
    for i, part in enumerate(parts):
        out.extend(await stream.on_message(response_body(part, eos=i == len(parts) - 1)))
    streamed = [a.response_body.response.body_mutation.streamed_response for a in out]
    assert b"".join(s.body for s in streamed) == b"".join(parts)
    assert [s.end_of_stream for s in streamed][-1]
    assert stream.phase is Phase.COMPLETE


async def test_stream_closed_mid_response_releases_the_lease() -> None:
    e = make_env()
    stream = e.stream()
    await feed(stream, [headers_msg(HEADERS, config=config()), body_msg(BODY), response_headers()])
    assert e.inflight.requests(P2) == 1
    stream.close()
    stream.close()  # idempotent
    assert e.inflight.requests(P2) == 0
    assert e.director.held == 0


# Held for its expected duration: the allowance plus its 10 output tokens (BODY) at the default TPOT.
HOLD_S = HOLD_OVERHEAD_S + 10 * DEFAULT_TPOT_S


async def test_no_response_expected_holds_the_lease_for_its_expected_duration() -> None:
    e = make_env(inflight_timeout_s=300.0)
    stream = e.stream()
    await feed(stream, [headers_msg(HEADERS, config=config(MODE.FULL_DUPLEX_STREAMED, MODE.NONE)), body_msg(BODY)])
    stream.close()
    assert e.inflight.requests(P2) == 1
    assert e.director.expire(e.clock() + HOLD_S - 0.1) == 0
    assert e.director.expire(e.clock() + HOLD_S) == 1
    assert e.inflight.requests(P2) == 0


async def test_header_values_as_strings_select_the_shim_profile() -> None:
    stream = make_env().stream()
    out = await feed(stream, [headers_msg({"Content-Type": "application/json"}, value_strings=True), body_msg(BODY)])
    assert kinds(out) == ["request_headers"]  # the shim reads nothing else; the body is not echoed
    assert stream.profile.name == "nginx"
