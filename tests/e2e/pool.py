"""The part every gateway end-to-end test shares: three HTTP backends reporting their own queue depth, and
``picker serve`` in front of them with the reference queue/KV scoring (it must route by the scraped queues)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

from picker.bench.policies import REFERENCE_CONFIG_TEXT
from tests.e2e.backends import Backend
from tests.e2e.procs import free_port, run_picker


@dataclass
class Pool:
    backends: list[Backend]
    picker: asyncio.subprocess.Process
    grpc_port: int
    metrics_url: str


@contextlib.asynccontextmanager
async def picker_over_backends(queues: Sequence[int], picker_args: Sequence[str] = ()) -> AsyncIterator[Pool]:
    """Backends ``b0, b1, ...`` with the given queue depths, and picker scraping them every 50 ms; stopped on exit."""
    backends = [Backend(f"b{i}", queue=q) for i, q in enumerate(queues)]
    for b in backends:
        await b.start()
    grpc_port, health_port, metrics_port = free_port(), free_port(), free_port()
    args = [
        "--endpoints", ",".join(b.hostport for b in backends),
        "--host", "127.0.0.1", "--grpc-port", str(grpc_port), "--grpc-health-port", str(health_port),
        "--metrics-port", str(metrics_port), "--refresh-metrics-interval", "50ms",
        # The reference default's queue / KV scoring: these tests route by the backends' scraped queues alone;
        # picker's built-in default also weighs prefix affinity and TTFT (test_default_follows_servers.py).
        "--config-text", REFERENCE_CONFIG_TEXT,
        *picker_args,
    ]  # fmt: skip
    metrics_url = f"http://127.0.0.1:{metrics_port}/metrics"
    try:
        async with run_picker(args, health_url=metrics_url) as picker:
            await asyncio.sleep(0.3)  # a few scrape intervals: picker has seen every queue
            yield Pool(backends, picker, grpc_port, metrics_url)
    finally:
        for b in backends:
            await b.stop()
