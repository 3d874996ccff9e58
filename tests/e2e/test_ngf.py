"""End to end on NGINX Gateway Fabric's data path: real nginx + njs (Debian) with NGF's ``epp.js`` → NGF's own
endpoint-picker shim → picker (TLS) → three HTTP backends. picker/bench/ngf.py builds the pieces.

The backends report their own queue depth; picker (reference queue/KV scoring) must send every request to the
backend with the shortest queue, through nginx's ``$inference_workload_endpoint``. FailOpen and FailClose are
NGF's map from the pick to the upstream; picker down, and picker refusing a request, are both exercised.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
import orjson
import pytest

from picker.bench import ngf, procs
from tests.e2e.backends import STREAM_WORDS
from tests.e2e.ngf_stack import access_log, post, stack

pytestmark = pytest.mark.e2e


@pytest.mark.parametrize("tls", [True, False], ids=["tls", "plaintext"])
async def test_requests_land_on_the_backend_picker_chose(tmp_path: Path, tls: bool) -> None:
    async with stack(tmp_path, tls=tls) as s, aiohttp.ClientSession() as session:
        for i in range(8):
            status, headers, body = await post(
                session, f"{s.url}/v1/completions?trace=1", {"model": "m", "prompt": f"q{i}", "max_tokens": 3}
            )
            assert status == 200, body
            assert headers["x-backend"] == "b1"  # the only backend with an empty queue
            assert orjson.loads(body)["choices"][0]["text"] == "".join(STREAM_WORDS[:3])
        assert len(s.backends[1].served) == 8
        picks = [ln.split(" ")[3] for ln in await access_log(s.directory, 8)]
        assert picks == [f'"{s.backends[1].hostport}"'] * 8  # $inference_workload_endpoint: picker's choice
        assert not s.backends[0].served
        assert not s.backends[2].served
        served = s.backends[1].served[0]
        assert served.path == "/v1/completions"  # the original URI, not NGF's internal location
        assert served.body == {"model": "m", "prompt": "q0", "max_tokens": 3}  # nginx sends the client's body

        # The queues change; picker's next scrape moves the traffic.
        s.backends[0].queue, s.backends[1].queue = 0, 20
        await asyncio.sleep(0.4)
        for i in range(4):
            status, headers, _ = await post(
                session, f"{s.url}/v1/completions", {"model": "m", "prompt": f"r{i}", "max_tokens": 2}
            )
            assert status == 200
            assert headers["x-backend"] == "b0"


async def test_streaming_response_passes_through_nginx(tmp_path: Path) -> None:
    """SSE arrives chunk by chunk as the server writes it (nginx's default proxy buffering, as NGF renders the
    internal location, passes each chunk on as it reads it), intact."""
    async with stack(tmp_path) as s, aiohttp.ClientSession() as session:
        s.backends[1].word_delay_s = 0.2
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8, "stream": True}
        loop = asyncio.get_running_loop()
        arrivals: list[float] = []
        raw = b""
        sent_at = loop.time()
        async with session.post(f"{s.url}/v1/chat/completions", data=orjson.dumps(body)) as resp:
            assert (resp.status, resp.headers["x-backend"]) == (200, "b1")
            async for piece in resp.content.iter_any():
                arrivals.append(loop.time() - sent_at)
                raw += piece
    lines = [ln for ln in raw.split(b"\n") if ln.startswith(b"data: ")]
    assert lines[-1] == b"data: [DONE]"
    chunks = [orjson.loads(ln[6:]) for ln in lines[:-1]]
    assert "".join(c["choices"][0]["delta"]["content"] for c in chunks if c["choices"]) == "".join(STREAM_WORDS)
    # 8 words 0.2 s apart: the first arrives long before the last is written (~1.6 s), in many pieces; a
    # buffered answer would arrive in one piece at the end.
    assert arrivals[0] < 1.0
    assert len(arrivals) >= 6
    assert arrivals[-1] - arrivals[0] > 1.0


@pytest.mark.parametrize("failure_mode", [ngf.FAIL_OPEN, ngf.FAIL_CLOSE])
async def test_picker_down(tmp_path: Path, failure_mode: str) -> None:
    """picker stops: the shim can't connect, epp.js sets no endpoint, and NGF's map decides."""
    async with stack(tmp_path, failure_mode=failure_mode) as s, aiohttp.ClientSession() as session:
        status, headers, _ = await post(session, f"{s.url}/v1/completions", {"model": "m", "prompt": "x"})
        assert (status, headers["x-backend"]) == (200, "b1")
        s.picker.terminate()
        await asyncio.wait_for(s.picker.wait(), 15)
        results = [await post(session, f"{s.url}/v1/completions", {"model": "m", "prompt": f"y{i}"}) for i in range(6)]
    statuses = [status for status, _, _ in results]
    if failure_mode == ngf.FAIL_OPEN:
        assert statuses == [200] * 6
        assert {h["x-backend"] for _, h, _ in results} <= {"b0", "b1", "b2"}
    else:
        # NGF's map sends an *empty* pick to the pool (`"" → upstream`); only a non-empty, non-matching value
        # would reach `default`. epp.js leaves the variable empty when the shim fails, so FailClose serves too.
        # This pins NGF's behaviour as its templates shape it (docs/gateways.md, "NGINX Gateway Fabric").
        assert statuses == [200] * 6


async def test_picker_refusing_a_request_is_bypassed(tmp_path: Path) -> None:
    """An ImmediateResponse (here a 400 for a body that is not JSON) becomes the shim's status; epp.js ignores
    every non-200, so nginx forwards the request to the pool anyway: the client never sees picker's 400."""
    async with stack(tmp_path) as s, aiohttp.ClientSession() as session:
        status, _, _ = await post(session, f"{s.url}/v1/completions", b"{not json")
    assert status == 500  # the backend itself fails on the broken JSON: nginx did forward it
    assert sum(len(b.served) for b in s.backends) == 0
    (line,) = (tmp_path / "nginx" / "access.log").read_text().splitlines()
    status_text, _, upstream, picked, uri = line.split(" ")
    assert (status_text, picked, uri) == ("500", '""', "/v1/completions")
    assert upstream.strip('"') in {b.hostport for b in s.backends}  # the pool's upstream, not a pick
    log = (tmp_path / "nginx" / "error.log").read_text()
    assert "could not get specific inference endpoint from EndpointPicker; status: 400" in log
    assert "inference error: BadRequest" in log


async def test_a_second_shim_waits_for_the_fixed_port() -> None:
    """NGF's shim always listens on 127.0.0.1:54800: a second run waits for the first (here: gives up after 0.3 s
    with a clear error) instead of colliding with it."""
    async with ngf.run_shim() as first:
        with pytest.raises(procs.ChildFailed, match=r"127.0.0.1:54800 is held by another run"):
            async with ngf.run_shim(lock_wait_s=0.3):
                pass
        first.check()
