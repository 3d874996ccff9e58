"""Plugins that set headers on the client's response: session affinity's ``x-session-token``, end to end.

The client sends back the token it got; the session-affinity scorer then sends its next request to the same pod.
"""

from __future__ import annotations

import base64
import dataclasses

import grpc
from envoy.config.core.v3 import base_pb2
from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb

from picker.app import serving
from tests.conftest import endpoint
from tests.extproc.conftest import make_store, settings
from tests.extproc.gateway import exchange, headers_msg
from tests.scheduling.helpers import HEAD

SESSION_CONFIG = (
    HEAD
    + """\
plugins:
- type: queue-scorer
- type: session-affinity-scorer
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: queue-scorer
    weight: 1
  - pluginRef: session-affinity-scorer
    weight: 10
"""
)

BODY = b'{"model":"m","prompt":"hello"}'


def _messages(token: str | None) -> list[pb.ProcessingRequest]:
    """Envoy full duplex: request headers, the body, then the upstream's response headers (no response body)."""
    headers = {":method": "POST", ":path": "/v1/completions", "content-type": "application/json"}
    if token is not None:
        headers["x-session-token"] = token
    mode = processing_mode_pb2.ProcessingMode.FULL_DUPLEX_STREAMED
    config = pb.ProtocolConfiguration(request_body_mode=mode, response_body_mode=mode)
    response_headers = base_pb2.HeaderMap(
        headers=[base_pb2.HeaderValue(key=k, raw_value=v) for k, v in ((":status", b"200"), ("content-type", b"x"))]
    )
    return [
        headers_msg(headers, config=config),
        pb.ProcessingRequest(request_body=pb.HttpBody(body=BODY, end_of_stream=True)),
        pb.ProcessingRequest(response_headers=pb.HttpHeaders(headers=response_headers, end_of_stream=True)),
    ]


def _session_token(answers: list[pb.ProcessingResponse]) -> str | None:
    for a in answers:
        if a.WhichOneof("response") == "response_headers":
            for opt in a.response_headers.response.header_mutation.set_headers:
                if opt.header.key == "x-session-token":
                    return opt.header.raw_value.decode()
    return None


def _destination(answers: list[pb.ProcessingResponse]) -> str:
    for a in answers:
        if a.WhichOneof("response") == "request_headers":
            for opt in a.request_headers.response.header_mutation.set_headers:
                if opt.header.key == "x-gateway-destination-endpoint":
                    return opt.header.raw_value.decode()
    raise AssertionError(f"no destination in {answers}")


async def test_session_token_is_set_on_the_response_and_pins_the_next_request() -> None:
    pods = [endpoint(1, waiting=0), endpoint(2, waiting=5), endpoint(3, waiting=9)]
    store = make_store([dataclasses.replace(p, name=f"pod-{i}") for i, p in enumerate(pods, 1)])
    config = dataclasses.replace(settings(), config_text=SESSION_CONFIG)
    async with serving(config, store=store, scrape=False) as r, grpc.aio.insecure_channel(r.grpc_target) as channel:
        first = await exchange(channel, _messages(None))
        assert _destination(first) == "192.168.1.1:8000"  # shortest queue
        token = _session_token(first)
        assert token is not None
        assert base64.b64decode(token).decode() == "/pod-1"

        # The pod with the session now has the longest queue; the token still wins.
        store.update_metrics({pods[0].key: dataclasses.replace(pods[0].metrics, waiting=50)})
        again = await exchange(channel, _messages(token))
        assert _destination(again) == "192.168.1.1:8000"
        # Without a token, the queue decides.
        other = await exchange(channel, _messages(None))
        assert _destination(other) == "192.168.1.2:8000"
        assert base64.b64decode(_session_token(other) or "").decode() == "/pod-2"


async def test_no_response_header_plugins_means_an_empty_answer() -> None:
    store = make_store([endpoint(1)])
    async with serving(settings(), store=store, scrape=False) as r, grpc.aio.insecure_channel(r.grpc_target) as ch:
        answers = await exchange(ch, _messages(None))
    headers_answers = [a for a in answers if a.WhichOneof("response") == "response_headers"]
    assert len(headers_answers) == 1
    assert not headers_answers[0].response_headers.response.header_mutation.set_headers
