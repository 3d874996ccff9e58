"""End to end on the real control plane: the real Envoy, picker as the chart's ServiceAccount, ``picker sim`` pods.

Envoy asks picker (ext_proc) for every request and sends it where picker says; picker knows the model servers only
from the API server (the InferencePool and its pods). Under a steady closed-loop load the pool is scaled up (two
pods added: they get requests) and down (a pod deleted, then its server stopped, as a kubelet would): no request
fails except those in flight on the removed server when it stopped.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import orjson
import pytest

from picker.bench import envoy as envoy_config
from picker.bench.cluster import ControlPlane
from picker.bench.procs import free_ports
from tests.cluster.stack import Picker, eventually, metrics, namespace, picker_serve, pool_values, release, sample, sims

pytestmark = [pytest.mark.timeout(180), pytest.mark.e2e]

HOSTS = ("127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5")
LABELS = {"app": "sim"}
CLIENTS = 4
MAX_REQUESTS = 3000  # bounds the load whatever happens


@dataclass
class Load:
    """``CLIENTS`` closed-loop clients through Envoy; every outcome kept as (start, end, status)."""

    url: str
    results: list[tuple[float, float, int]] = field(default_factory=list)
    stop: asyncio.Event = field(default_factory=asyncio.Event)

    async def client(self, session: aiohttp.ClientSession, index: int) -> None:
        body = orjson.dumps({"model": "sim-model", "prompt": f"client {index} says hello", "max_tokens": 8})
        while not self.stop.is_set() and len(self.results) < MAX_REQUESTS:
            start = time.monotonic()
            try:
                async with session.post(
                    f"{self.url}/v1/completions", data=body, headers={"content-type": "application/json"}
                ) as resp:
                    await resp.read()
                    status = resp.status
            except aiohttp.ClientError:
                status = 0
            self.results.append((start, time.monotonic(), status))

    async def run(self) -> None:
        timeout = aiohttp.ClientTimeout(total=30)
        async with aiohttp.ClientSession(timeout=timeout) as session, asyncio.TaskGroup() as tg:
            for i in range(CLIENTS):
                tg.create_task(self.client(session, i))


async def served(host: str, port: int) -> float:
    series = await metrics(f"http://{host}:{port}/metrics")
    return sample(series, "vllm:request_success_total", {})


async def test_scale_up_and_down_under_load(control_plane: ControlPlane, tmp_path: Path) -> None:
    cp = control_plane
    (port,) = free_ports(1, hosts=HOSTS)
    listen_port, admin_port = free_ports(2)
    with namespace(cp, "e2e") as ns:
        release(cp, ns, pool_values(LABELS, port), tmp_path)
        async with sims(HOSTS, port) as servers:
            cp.fake_pod(ns, "p1", LABELS, HOSTS[0])
            cp.fake_pod(ns, "p2", LABELS, HOSTS[1])
            async with picker_serve(cp, ns, tmp_path) as p:
                key = {f"p{i + 1}": f"{ip}:{port}" for i, ip in enumerate(HOSTS)}
                await eventually(lambda: _endpoints_are(p, {key["p1"], key["p2"]}), what="two endpoints")
                config = envoy_config.render(
                    listen_port=listen_port,
                    admin_port=admin_port,
                    picker_port=p.grpc_port,
                    backends=[(h, port) for h in HOSTS],
                    body_mode="BUFFERED",
                    picker_tls=False,
                )
                async with envoy_config.run_envoy(config, admin_port):
                    load = Load(f"http://127.0.0.1:{listen_port}")
                    runner = asyncio.create_task(load.run())
                    try:
                        await asyncio.sleep(1.5)
                        assert not [r for r in load.results if r[2] != 200]

                        # Scale up: two more pods; picker learns them from the API and they get requests.
                        before = {h: await served(h, port) for h in HOSTS[2:]}
                        cp.fake_pod(ns, "p3", LABELS, HOSTS[2])
                        cp.fake_pod(ns, "p4", LABELS, HOSTS[3])
                        await eventually(lambda: _endpoints_are(p, set(key.values())), what="four endpoints")
                        for h in HOSTS[2:]:
                            await eventually(
                                lambda h=h: _served_more(h, port, before[h]), what=f"{h} serving", timeout_s=10
                            )

                        # Scale down: the pod is deleted; once picker dropped it, its server stops (a kubelet
                        # would SIGTERM it meanwhile). Only what was in flight on it may fail.
                        cp.kubectl("delete", "pod", "p1", "-n", ns, "--wait=false")
                        await eventually(lambda: _endpoints_are(p, {key["p2"], key["p3"], key["p4"]}), what="p1 gone")
                        killed_at = time.monotonic()
                        servers[HOSTS[0]].proc.kill()
                        await servers[HOSTS[0]].proc.wait()
                        await asyncio.sleep(1.5)
                        after = {h: await served(h, port) for h in HOSTS[1:]}
                        for h in HOSTS[1:]:  # the other three carry the load
                            await eventually(
                                lambda h=h: _served_more(h, port, after[h]), what=f"{h} still serving", timeout_s=10
                            )
                    finally:
                        load.stop.set()
                        with contextlib.suppress(Exception):
                            await asyncio.wait_for(runner, 30)
                    failed = [r for r in load.results if r[2] != 200]
                    print(f"scale 2 → 4 → 3 pods under load: {len(load.results)} requests, {len(failed)} failed")
                    assert len(load.results) > 50
                    # Failures only among requests in flight when the server stopped: at most one per client.
                    assert len(failed) <= CLIENTS, failed
                    assert all(start <= killed_at <= end for start, end, _ in failed), (killed_at, failed)


async def _endpoints_are(p: Picker, want: set[str]) -> bool:
    return await p.endpoints() == want


async def _served_more(host: str, port: int, before: float) -> bool:
    return await served(host, port) > before
