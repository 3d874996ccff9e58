"""The built-in default follows what the servers report, over real gRPC with real scraping.

Three vLLM-style servers report their queues on ``/metrics`` (``vllm:num_requests_waiting`` 5, 0 and 9); a real
picker with its built-in default scrapes them every 100 ms and is asked, over the ext_proc stream, where to send
requests that no picker routed before. It must choose the idle server; when the reported queues change (the idle
server becomes the busiest), it must follow within two scrape intervals. None of the queued requests were sent
by picker: its own ledger is empty, so only the servers' reports can tell the servers apart. A burst of requests
held in flight goes to the idle server until picker's own requests there reach the other queues.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import AsyncIterator, Sequence

import orjson
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc

from picker.app import Running, serving
from picker.settings import ScrapeSettings, Settings, StaticEndpoint
from tests.e2e.backends import Backend
from tests.extproc.conftest import settings
from tests.extproc.gateway import EnvoyFullDuplex, gateway

INTERVAL_S = 0.1
HEADERS = {":method": "POST", ":path": "/v1/completions", "content-type": "application/json"}


def body(i: int) -> bytes:
    # Distinct short prompts: no prefix affinity between them; a small answer: a light request of picker's own.
    return orjson.dumps({"model": "m", "prompt": f"question number {i}: what is two plus two?", "max_tokens": 8})


@contextlib.asynccontextmanager
async def pool(queues: Sequence[int]) -> AsyncIterator[tuple[list[Backend], Running]]:
    backends = [Backend(f"s{i}", queue=q, host=f"127.0.0.{i + 2}") for i, q in enumerate(queues)]
    for b in backends:
        await b.start()
    base = settings()
    cfg = dataclasses.replace(
        base,
        config_text=None,  # the built-in default
        scrape=ScrapeSettings(interval_s=INTERVAL_S),
        static_endpoints=tuple(StaticEndpoint(address=b.host, port=b.port) for b in backends),
    )
    assert isinstance(cfg, Settings)
    try:
        async with serving(cfg, scrape=True) as running:
            yield backends, running
    finally:
        for b in backends:
            await b.stop()


async def scraped(running: Running, queues: Sequence[int], backends: Sequence[Backend]) -> float:
    """Wait until picker's store shows ``queues``; returns when it did (monotonic)."""
    want = {b.hostport: q for b, q in zip(backends, queues, strict=True)}
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline:
        snap = running.store.current()
        if all((e := snap.get(k)) is not None and e.metrics.waiting == q for k, q in want.items()):
            return time.monotonic()
        await asyncio.sleep(0.005)
    raise AssertionError(f"picker never scraped {want}")


async def test_default_chooses_the_idle_server_and_follows_when_queues_change() -> None:
    async with pool((5, 0, 9)) as (backends, running), gateway(EnvoyFullDuplex, running.grpc_target) as gw:
        await scraped(running, (5, 0, 9), backends)
        first = [await gw.request(HEADERS, [body(i)]) for i in range(6)]
        assert [o.destination for o in first] == [backends[1].hostport] * 6, [o.error_body for o in first]

        # The idle server becomes the busiest; the first one is now the idle one.
        changed_at = time.monotonic()
        backends[0].queue, backends[1].queue, backends[2].queue = 0, 12, 9
        seen_at = await scraped(running, (0, 12, 9), backends)
        assert seen_at - changed_at <= 2 * INTERVAL_S + 0.1  # the poller's tick plus the page's round trip
        after = [await gw.request(HEADERS, [body(100 + i)]) for i in range(6)]
        assert [o.destination for o in after] == [backends[0].hostport] * 6


async def routed_and_held(gw: EnvoyFullDuplex, i: int, release: asyncio.Event) -> str:
    """Send request ``i`` and read picker's routing answer, keeping the stream open (the request in flight,
    picker's lease held) until ``release``. Returns the destination."""
    msgs = gw.request_messages(HEADERS, [body(i)])

    async def requests() -> AsyncIterator[pb.ProcessingRequest]:
        for m in msgs:
            yield m
        await release.wait()

    call = pb_grpc.ExternalProcessorStub(gw.channel()).Process(requests(), timeout=10.0)
    answers: list[pb.ProcessingResponse] = []
    async for answer in call:
        answers.append(answer)
        if answer.WhichOneof("response") == "request_body":
            outcome = gw.interpret(msgs, answers, body(i), None)
            assert outcome.destination, answers
            return outcome.destination
    raise AssertionError(f"no routing answer: {answers}")


async def test_a_burst_goes_to_the_idle_server_until_pickers_own_requests_there_reach_the_others_queues() -> None:
    async with pool((5, 0, 9)) as (backends, running), gateway(EnvoyFullDuplex, running.grpc_target) as gw:
        await scraped(running, (5, 0, 9), backends)
        release = asyncio.Event()
        busy, idle, busiest = (b.hostport for b in backends)
        try:
            burst = [await routed_and_held(gw, 200 + i, release) for i in range(12)]
        finally:
            release.set()
        assert burst[:5] == [idle] * 5, burst  # fewer of picker's own there than the 5 waiting elsewhere
        assert busiest not in burst[:10], burst  # 9 waiting there: the last to get any
        assert busy in burst, burst  # once picker's own there reach 5, the server with 5 waiting takes its turn
