"""Run simulated servers from code: inside the caller's event loop, or in a background thread.

async with running(preset("fast")) as server:          # port picked free on 127.0.0.1
    ...server.url...

with ThreadedServers(preset("fast"), count=3) as sims:  # for synchronous callers (CLI tests, the demo)
    ...sims.urls...
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator
from concurrent.futures import Future
from typing import Any

from picker.sim.config import EngineConfig
from picker.sim.server import ServerConfig, SimServer

__all__ = ["ThreadedServers", "running"]


@contextlib.asynccontextmanager
async def running(engine_config: EngineConfig, **server_config: Any) -> AsyncIterator[SimServer]:
    """One started server (``ServerConfig`` fields as keywords; port 0 by default), stopped on exit."""
    server_config.setdefault("port", 0)
    server = SimServer(engine_config, ServerConfig(**server_config))
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


class ThreadedServers:
    """``count`` servers on free ports, served by an event loop in a daemon thread."""

    def __init__(self, engine_config: EngineConfig, *, count: int = 1, **server_config: Any) -> None:
        self._engine_config = engine_config
        self._count = count
        self._server_config = server_config
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="sim-servers", daemon=True)
        self.servers: list[SimServer] = []

    @property
    def urls(self) -> list[str]:
        return [s.url for s in self.servers]

    def call(self, coro: Any, timeout_s: float = 10.0) -> Any:
        """Run a coroutine on the servers' loop and wait for it."""
        fut: Future[Any] = asyncio.run_coroutine_threadsafe(coro, self._loop)
        return fut.result(timeout_s)

    def start(self) -> ThreadedServers:
        self._thread.start()

        async def start_all() -> list[SimServer]:
            servers = []
            for i in range(self._count):
                cfg = {"port": 0, "fault_seed": i, **self._server_config}
                server = SimServer(self._engine_config, ServerConfig(**cfg))
                await server.start()
                servers.append(server)
            return servers

        self.servers = self.call(start_all())
        return self

    def stop(self) -> None:
        async def stop_all() -> None:
            for server in self.servers:
                await server.stop()

        try:
            if self._thread.is_alive():
                self.call(stop_all())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(5.0)
            if not self._thread.is_alive():
                self._loop.close()

    def __enter__(self) -> ThreadedServers:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
