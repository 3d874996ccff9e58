"""Property: whatever a peer sends — random or malformed bodies, headers, modes and message orders — picker
answers with a 4xx ImmediateResponse or ends the stream cleanly (gRPC OK), never an INTERNAL error or a hang,
and keeps serving afterwards with no in-flight count leaked.

The server runs in its own thread and event loop; hypothesis drives it with a synchronous gRPC client.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator

import grpc
import orjson
from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from picker.app import Running
from tests.conftest import endpoint
from tests.extproc.conftest import make_store, picker
from tests.extproc.gateway import MODE, headers_msg, served_metadata, subset_metadata

MAX_BODY = 2048
VALID = b'{"model":"my-model","prompt":"hello","max_tokens":5}'


@contextlib.contextmanager
def threaded_picker() -> Iterator[Running]:
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    holder: list[Running] = []
    stop: list[asyncio.Event] = []

    async def main() -> None:
        stop.append(asyncio.Event())
        store = make_store([endpoint(1, waiting=3), endpoint(2), endpoint(3, waiting=10)])
        # Fuzzed streams leave routed requests unanswered, which is what a hung server looks like to picker's
        # hung-server detection (endpoints/hung.py); this test is about the protocol, so the detector is off.
        limits = {"max_body_bytes": MAX_BODY, "max_response_buffer_bytes": MAX_BODY}
        async with picker(store, hung_server_detection=False, **limits) as running:
            holder.append(running)
            ready.set()
            await stop[0].wait()

    thread = threading.Thread(target=loop.run_until_complete, args=(main(),), daemon=True)
    thread.start()
    assert ready.wait(20), "picker did not start"
    try:
        yield holder[0]
    finally:
        loop.call_soon_threadsafe(stop[0].set)
        thread.join(20)
        loop.close()


modes = st.sampled_from(
    [MODE.NONE, MODE.STREAMED, MODE.BUFFERED, MODE.BUFFERED_PARTIAL, MODE.FULL_DUPLEX_STREAMED, MODE.GRPC]
)
header_names = st.sampled_from(
    [
        ":path",
        ":method",
        ":status",
        "content-type",
        "x-request-id",
        "x-gateway-destination-endpoint",
        "x-gateway-model-name-rewrite",
        "x-gateway-inference-objective",
        "X-Mixed-Case",
        "",
    ]
)
header_values = st.one_of(
    st.sampled_from(
        ["/v1/completions", "/v1/chat/completions", "/v1/embeddings", "/v1/responses", "text/event-stream"]
    ),
    st.text(max_size=20),
)
json_bodies = st.builds(
    orjson.dumps,
    st.dictionaries(
        st.sampled_from(["model", "prompt", "messages", "input", "max_tokens", "stream", "x"]),
        st.one_of(
            st.text(max_size=10),
            st.integers(-5, 10**12),
            st.booleans(),
            st.none(),
            st.lists(st.dictionaries(st.sampled_from(["role", "content"]), st.text(max_size=5)), max_size=2),
        ),
        max_size=5,
    ),
)
bodies = st.one_of(json_bodies, st.binary(max_size=64), st.just(VALID), st.just(b"x" * (MAX_BODY + 1)), st.just(b""))


@st.composite
def messages(draw: st.DrawFn, kind: str | None = None) -> pb.ProcessingRequest:
    if kind is None:
        kind = draw(st.sampled_from(["headers", "body", "trailers", "rheaders", "rbody", "rtrailers", "empty"]))
    if kind in ("headers", "rheaders"):
        headers = draw(st.dictionaries(header_names, header_values, max_size=5))
        config = None
        if kind == "headers" and draw(st.booleans()):
            config = pb.ProtocolConfiguration(request_body_mode=draw(modes), response_body_mode=draw(modes))
        msg = headers_msg(headers, eos=draw(st.booleans()), value_strings=draw(st.booleans()), config=config)
        if kind == "rheaders":
            msg = pb.ProcessingRequest(response_headers=msg.request_headers)
    elif kind in ("body", "rbody"):
        body = pb.HttpBody(body=draw(bodies), end_of_stream=draw(st.booleans()))
        msg = pb.ProcessingRequest(request_body=body) if kind == "body" else pb.ProcessingRequest(response_body=body)
    elif kind == "trailers":
        msg = pb.ProcessingRequest(request_trailers=pb.HttpTrailers())
    elif kind == "rtrailers":
        msg = pb.ProcessingRequest(response_trailers=pb.HttpTrailers())
    else:
        msg = pb.ProcessingRequest()
    extra = draw(st.sampled_from(["none", "served", "other", "subset"]))
    if extra == "served":
        msg.metadata_context.CopyFrom(served_metadata(draw(st.text(max_size=8))))
    elif extra == "subset":
        msg.metadata_context.CopyFrom(subset_metadata(draw(st.sampled_from(["192.168.1.2:8000", ["192.168.1.1"], 5]))))
    elif extra == "other":
        md = base_pb2.Metadata()
        md.filter_metadata["envoy.lb"].update({"unrelated": [1, "x"]})
        msg.metadata_context.CopyFrom(md)
    return msg


# Mostly sequences that start like a request (so the later phases get exercised), some that don't.
sequences = st.one_of(
    st.builds(lambda first, rest: [first, *rest], messages("headers"), st.lists(messages(), max_size=6)),
    st.lists(messages(), max_size=7),
)


def test_any_message_sequence_gets_a_4xx_or_a_clean_close() -> None:
    with threaded_picker() as running, grpc.insecure_channel(running.grpc_target) as channel:
        stub = pb_grpc.ExternalProcessorStub(channel)

        @settings(
            max_examples=150,
            deadline=5000,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
            database=None,
        )
        @given(sequences)
        def check(msgs: list[pb.ProcessingRequest]) -> None:
            answers = list(stub.Process(iter(msgs), timeout=5))  # raises on any non-OK status (INTERNAL: a bug)
            imm = [a for a in answers if a.WhichOneof("response") == "immediate_response"]
            assert len(imm) <= 1
            if imm:
                assert answers[-1] is imm[0], "nothing follows an ImmediateResponse"
                code = int(imm[0].immediate_response.status.code)
                # 4xx for anything the peer got wrong; 503 only for a subset hint that matches nothing.
                assert 400 <= code < 500 or (code == 503 and any(m.HasField("metadata_context") for m in msgs))
                assert imm[0].immediate_response.body.startswith(b"inference error: ")

        check()

        # Still serving: a well-formed request is routed.
        good = [
            headers_msg({":path": "/v1/completions"}, config=pb.ProtocolConfiguration(request_body_mode=MODE.BUFFERED)),
            pb.ProcessingRequest(request_body=pb.HttpBody(body=VALID, end_of_stream=True)),
        ]
        answers = list(stub.Process(iter(good), timeout=5))
        assert [a.WhichOneof("response") for a in answers] == ["request_headers", "request_body"]
        dest = answers[1].request_body.response.header_mutation.set_headers[0].header
        assert (dest.key, dest.raw_value) == ("x-gateway-destination-endpoint", b"192.168.1.2:8000")

    # Every lease still counted is held for expiry (the peer gave no response phase): none leaked.
    director = running.director
    in_flight = sum(running.inflight.requests(f"192.168.1.{i}:8000") for i in (1, 2, 3))
    assert in_flight == director.held
