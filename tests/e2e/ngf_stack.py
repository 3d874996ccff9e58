"""The NGINX Gateway Fabric stack the NGF end-to-end tests share: real nginx + njs with NGF's ``epp.js``, NGF's
own shim (fixed port 127.0.0.1:54800, taken in turn under ``picker.bench.portlock``), picker and three backends
reporting their queues (``tests.e2e.pool``)."""

from __future__ import annotations

import asyncio
import contextlib
import io
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import orjson

from picker.bench import ngf, procs
from tests.e2e.backends import Backend
from tests.e2e.pool import picker_over_backends
from tests.e2e.procs import free_port

__all__ = ["Stack", "access_log", "nginx_only", "post", "stack"]


@dataclass
class Stack:
    url: str
    backends: list[Backend]
    picker: asyncio.subprocess.Process
    metrics_url: str
    grpc_port: int
    nginx: procs.Child
    shim: procs.Child
    directory: Path  # the nginx prefix: access.log, error.log


@contextlib.asynccontextmanager
async def nginx_only(
    directory: Path, backends: Sequence[Backend], picker_port: int, *, failure_mode: str, body_buffer: str | None
) -> AsyncIterator[tuple[str, procs.Child]]:
    """nginx as NGF renders the route, its EndpointPicker at 127.0.0.1:``picker_port``; yields its URL."""
    listen_port = free_port()
    config = ngf.render(
        directory,
        listen_port=listen_port,
        picker_host="127.0.0.1",
        picker_port=picker_port,
        backends=[("127.0.0.1", b.port) for b in backends],
        failure_mode=failure_mode,
        body_buffer=body_buffer,
    )
    async with ngf.run_nginx(config, listen_port) as nginx:
        yield f"http://127.0.0.1:{listen_port}", nginx


@contextlib.asynccontextmanager
async def stack(
    tmp_path: Path,
    *,
    failure_mode: str = ngf.FAIL_CLOSE,
    queues: tuple[int, ...] = (10, 0, 5),
    tls: bool = True,
    picker_args: Sequence[str] = (),
    body_buffer: str | None = None,
) -> AsyncIterator[Stack]:
    args = [f"--secure-serving={'true' if tls else 'false'}", *picker_args]
    async with picker_over_backends(queues, args) as pool:
        directory = tmp_path / "nginx"
        async with (
            ngf.run_shim(tls=tls) as shim,
            nginx_only(
                directory, pool.backends, pool.grpc_port, failure_mode=failure_mode, body_buffer=body_buffer
            ) as (url, nginx),
        ):
            yield Stack(url, pool.backends, pool.picker, pool.metrics_url, pool.grpc_port, nginx, shim, directory)
            for child in (nginx, shim):
                child.check()


async def post(
    session: aiohttp.ClientSession, url: str, body: dict[str, object] | bytes, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], bytes]:
    data = io.BytesIO(body if isinstance(body, bytes) else orjson.dumps(body))  # large bodies too (aiohttp warns)
    async with session.post(url, data=data, headers={"content-type": "application/json", **(headers or {})}) as resp:
        return resp.status, dict(resp.headers), await resp.read()


async def access_log(directory: Path, lines: int, timeout_s: float = 5.0) -> list[str]:
    """nginx writes a request's access-log line after it has sent the response: wait for ``lines`` of them.

    A line: ``status request_time "upstream_addr" "$inference_workload_endpoint" request_uri``."""
    path = directory / "access.log"
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        found = path.read_text().splitlines() if path.exists() else []
        if len(found) >= lines or loop.time() >= deadline:
            return found
        await asyncio.sleep(0.02)
