"""In-flight and response accounting through the stream: TTFT/TPOT only from streamed responses, usage from SSE
split across chunks, release at completion, at stream end, and by timeout when no response phase comes."""

from __future__ import annotations

from typing import Any

import pytest

from picker.control.director import DEFAULT_TPOT_S, HOLD_OVERHEAD_S
from picker.extproc.stream import Phase, Stream
from tests.extproc.gateway import MODE, headers_msg
from tests.extproc.test_stream import (
    BODY,
    HEADERS,
    P2,
    Env,
    body_msg,
    config,
    feed,
    make_env,
    response_body,
    response_headers,
)

EVENTS = [b'data: {"choices":[{"text":"%d"}]}\n\n' % i for i in range(5)]


async def _routed(e: Env, response_mode: int = MODE.FULL_DUPLEX_STREAMED) -> Stream:
    stream = e.stream()
    await feed(stream, [headers_msg(HEADERS, config=config(response_mode=response_mode)), body_msg(BODY)])
    return stream


async def test_sse_without_usage_observes_ttft_and_tpot_from_events() -> None:
    e = make_env()
    stream = await _routed(e)
    await stream.on_message(response_headers("text/event-stream"))
    e.clock.advance(0.2)
    await stream.on_message(response_body(EVENTS[0]))
    e.clock.advance(0.4)
    # The other four events, the last one split across two chunks.
    rest = b"".join(EVENTS[1:])
    await stream.on_message(response_body(rest[:-10]))
    await stream.on_message(response_body(rest[-10:] + b"data: [DONE]\n\n", eos=True))
    load = e.inflight.load(P2)
    assert e.inflight.requests(P2) == 0
    assert load.ttft_s == pytest.approx(0.2)
    assert load.tpot_s == pytest.approx(0.1)  # 0.4 s over 5 - 1 events
    assert e.scheduler.infos[-1].completion_tokens is None


async def test_sse_usage_split_across_chunks_sets_tpot() -> None:
    e = make_env()
    stream = await _routed(e)
    await stream.on_message(response_headers("text/event-stream"))
    e.clock.advance(0.1)
    await stream.on_message(response_body(EVENTS[0]))
    e.clock.advance(1.0)
    usage = b'data: {"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":11}}\n\ndata: [DONE]\n\n'
    await stream.on_message(response_body(usage[:30]))
    await stream.on_message(response_body(usage[30:], eos=True))
    assert e.inflight.load(P2).tpot_s == pytest.approx(0.1)  # 1.0 s over 11 - 1 tokens
    assert e.scheduler.infos[-1].completion_tokens == 11


async def test_json_response_is_accounted_but_gives_no_ttft() -> None:
    e = make_env()
    stream = await _routed(e)
    await stream.on_message(response_headers("application/json"))
    e.clock.advance(3.0)
    whole = b'{"choices":[{"text":"hi"}],"usage":{"prompt_tokens":2,"completion_tokens":30}}'
    await stream.on_message(response_body(whole[:20]))
    await stream.on_message(response_body(whole[20:], eos=True))
    assert stream.phase is Phase.COMPLETE
    assert e.inflight.requests(P2) == 0
    load = e.inflight.load(P2)
    assert (load.ttft_s, load.tpot_s) == (None, None)
    info = e.scheduler.infos[-1]
    assert (info.completion_tokens, info.ttft_s) == (30, None)


async def test_stream_end_mid_response_releases() -> None:
    e = make_env()
    stream = await _routed(e)
    await stream.on_message(response_headers("text/event-stream"))
    await stream.on_message(response_body(EVENTS[0]))
    assert e.inflight.requests(P2) == 1
    stream.close()
    assert e.inflight.requests(P2) == 0


# Held for its expected duration: the allowance plus its 10 output tokens (BODY) at the default TPOT.
HOLD_S = HOLD_OVERHEAD_S + 10 * DEFAULT_TPOT_S


async def test_no_response_phases_hold_the_lease_for_its_expected_duration() -> None:
    e = make_env(inflight_timeout_s=300.0)
    stream = await _routed(e, response_mode=MODE.NONE)
    stream.close()
    assert e.inflight.requests(P2) == 1  # the request may still be running upstream
    assert e.director.expire(e.clock() + HOLD_S - 0.1) == 0
    assert e.director.expire(e.clock() + HOLD_S) == 1
    assert e.inflight.requests(P2) == 0


# -- hung-server detection: only requests whose response the gateway will report are waited for ---------------


async def _warm_reference(e: Env) -> None:
    """One request answered in 0.2 s, so the pool has a reference time."""
    stream = await _routed(e)
    e.clock.advance(0.2)
    await stream.on_message(response_headers("application/json"))
    await stream.on_message(response_body(b"{}", eos=True))


@pytest.mark.parametrize(
    "first_message",
    [
        pytest.param(lambda: headers_msg(HEADERS, config=config(response_mode=MODE.NONE)), id="response-mode-none"),
        pytest.param(lambda: headers_msg(HEADERS), id="no-protocol-config"),
        pytest.param(lambda: headers_msg(HEADERS, value_strings=True), id="nginx-shim"),
    ],
)
async def test_gateways_without_response_phases_never_make_a_server_suspect(first_message: Any) -> None:
    e = make_env(inflight_timeout_s=300.0)
    await _warm_reference(e)
    for _ in range(20):  # requests whose answers picker never sees
        stream = e.stream()
        await feed(stream, [first_message(), body_msg(BODY)])
        stream.close()
    for _ in range(60):
        e.clock.advance(1.0)
        assert e.director.check_hung() == []
    assert all(not ep.suspect for ep in e.director.store.current())


async def test_a_server_without_answer_is_suspect_and_its_non_streamed_response_brings_it_back() -> None:
    e = make_env()
    await _warm_reference(e)
    stream = await _routed(e)
    e.clock.advance(1.0)
    assert [(c.key, c.suspect) for c in e.director.check_hung()] == [(P2, True)]
    await stream.on_message(response_headers("application/json"))  # the whole response is ready
    assert not e.director.store.current().get(P2).suspect  # type: ignore[union-attr]


async def test_a_streamed_response_answers_at_its_first_token_not_its_headers() -> None:
    e = make_env()
    await _warm_reference(e)
    stream = await _routed(e)
    await stream.on_message(response_headers("text/event-stream"))  # the API server answers, the engine not yet
    e.clock.advance(1.0)
    assert [(c.key, c.suspect) for c in e.director.check_hung()] == [(P2, True)]
    await stream.on_message(response_body(EVENTS[0]))
    assert not e.director.store.current().get(P2).suspect  # type: ignore[union-attr]
