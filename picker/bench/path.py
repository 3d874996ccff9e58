"""The whole request path in process, for ``picker bench schedule --whole-path``: what the servicer runs per gRPC
stream (``Stream.on_message`` for each message, then ``close``), on a picker started in this event loop.

The one bench module that imports the service (``.importlinter`` lets it): it measures the service's own path.
"""

from __future__ import annotations

import dataclasses
import itertools
import statistics
import time
from collections.abc import Sequence

from picker import app
from picker.bench.extproc_client import build_messages
from picker.bench.overhead import fresh_prompt_bodies, prompt_bodies
from picker.endpoints.model import Endpoint
from picker.endpoints.store import EndpointStore
from picker.extproc.stream import Stream
from picker.settings import ServerSettings, Settings

__all__ = ["WARM_CYCLES", "measure"]

WARM_CYCLES = 200  # requests (or scheduling cycles) before the timings: the prefix index warm


async def measure(
    endpoints: Sequence[Endpoint],
    size: int,
    config_text: str | None,
    *,
    cycles: int,
    repeat: int,
    prefilter: int,
    fresh: bool = False,
) -> float:
    """µs per request through ``Stream`` (what the servicer runs per gRPC stream) of a picker started in this
    event loop without ports' traffic or scraping. ``fresh``: every request's prompt is new to the prefix index."""
    store = EndpointStore()
    store.set_endpoints(endpoints)
    server = dataclasses.replace(
        ServerSettings(), host="127.0.0.1", grpc_port=0, health_port=0, metrics_port=0, secure_serving=False
    )
    settings = Settings(server=server, config_text=config_text, prefilter_endpoints=prefilter)
    async with app.serving(settings, store=store, scrape=False) as running:
        env = running.extproc.env
        messages = [
            build_messages({":method": "POST", ":path": "/v1/completions", "content-length": str(len(b))}, b)
            for b in (fresh_prompt_bodies(size, WARM_CYCLES + cycles * repeat) if fresh else prompt_bodies(size))
        ]

        sent = itertools.count()  # across the timings: with ``fresh`` no prompt comes twice

        async def requests(n: int) -> None:
            for _ in range(n):
                stream = Stream(env)
                for message in messages[next(sent) % len(messages)]:
                    await stream.on_message(message)
                stream.close()

        await requests(WARM_CYCLES)
        timings = []
        for _ in range(repeat):
            started = time.perf_counter()
            await requests(cycles)
            timings.append((time.perf_counter() - started) / cycles * 1e6)
    return float(statistics.median(timings))
