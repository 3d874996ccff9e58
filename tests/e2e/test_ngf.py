"""End to end on NGINX Gateway Fabric's data path: real nginx + njs (Debian) → the endpoint-picker shim (Go,
tools/ngf-shim) → picker (TLS) → three HTTP backends. picker/bench/ngf.py builds the pieces.

The backends report their own queue depth; picker (reference queue/KV scoring) must send every request to the
backend with the shortest queue, through nginx's ``$inference_workload_endpoint``. FailOpen and FailClose are
NGF's map from the pick to the upstream; picker down, and picker refusing a request, are both exercised.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import orjson
import pytest

from picker.bench import ngf, procs
from tests.e2e.backends import STREAM_WORDS, Backend
from tests.e2e.pool import picker_over_backends
from tests.e2e.procs import free_port

pytestmark = pytest.mark.e2e


@dataclass
class Stack:
    url: str
    backends: list[Backend]
    picker: asyncio.subprocess.Process
    nginx: procs.Child
    shim: procs.Child


@contextlib.asynccontextmanager
async def stack(
    tmp_path: Path, *, failure_mode: str = ngf.FAIL_CLOSE, queues: tuple[int, ...] = (10, 0, 5), tls: bool = True
) -> AsyncIterator[Stack]:
    listen_port = free_port()
    async with picker_over_backends(queues, [f"--secure-serving={'true' if tls else 'false'}"]) as pool:
        config = ngf.render(
            tmp_path / "nginx",
            listen_port=listen_port,
            picker_host="127.0.0.1",
            picker_port=pool.grpc_port,
            backends=[("127.0.0.1", b.port) for b in pool.backends],
            failure_mode=failure_mode,
        )
        async with ngf.run_shim(tls=tls) as shim, ngf.run_nginx(config, listen_port) as nginx:
            yield Stack(f"http://127.0.0.1:{listen_port}", pool.backends, pool.picker, nginx, shim)
            for child in (nginx, shim):
                child.check()


async def post(
    session: aiohttp.ClientSession, url: str, body: dict[str, object] | bytes, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], bytes]:
    data = body if isinstance(body, bytes) else orjson.dumps(body)
    async with session.post(url, data=data, headers={"content-type": "application/json", **(headers or {})}) as resp:
        return resp.status, dict(resp.headers), await resp.read()


async def access_log(tmp_path: Path, lines: int, timeout_s: float = 5.0) -> list[str]:
    """nginx writes a request's access-log line after it has sent the response: wait for ``lines`` of them."""
    path = tmp_path / "nginx" / "access.log"
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        found = path.read_text().splitlines() if path.exists() else []
        if len(found) >= lines or loop.time() >= deadline:
            return found
        await asyncio.sleep(0.02)


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
        picks = [ln.split(" ")[3] for ln in await access_log(tmp_path, 8)]
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
    async with stack(tmp_path) as s, aiohttp.ClientSession() as session:
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8, "stream": True}
        status, headers, raw = await post(session, f"{s.url}/v1/chat/completions", body)
        assert status == 200
        assert headers["x-backend"] == "b1"
        lines = [ln for ln in raw.split(b"\n") if ln.startswith(b"data: ")]
        assert lines[-1] == b"data: [DONE]"
        chunks = [orjson.loads(ln[6:]) for ln in lines[:-1]]
        assert "".join(c["choices"][0]["delta"]["content"] for c in chunks if c["choices"]) == "".join(STREAM_WORDS)


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
